"""Transactions in one store: the half message stored where no consumer reads it, an end that
commits (the real message, sysflag COMMIT, PREPAREDTRANSACTIONOFFSET, an op in the next batch)
or rolls back (an op, at once), decided once: a different end after it is refused, the same one written no second time,
also when the end was cut short between the commit and its op, and after a restart (the
state is found in the index, not in memory)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.core.config import load_config
from common.core.errors import GetStatus, PutStatus
from common.core.message import PROPERTY_UNIQ_KEY, Message, MessageExt
from common.core.transaction import (
    HALF_ORIGIN,
    HALF_TOPIC,
    OP_STATE,
    OP_TOPIC,
    PRODUCER_GROUP,
    SYSFLAG_TRANSACTION_MASK,
    TRAN_MSG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ID,
    TransactionState,
)
from common.store.message_store import MessageStore
from common.store.transaction import records

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

HOST = ("10.0.0.9", 4000)
COMMIT, ROLLBACK = TransactionState.COMMIT, TransactionState.ROLLBACK


def open_store(root: Path, **over: object) -> MessageStore:
    fields: dict[str, object] = {"storePathRootDir": str(root),
                                 "mappedFileSizeCommitLog": 1024 * 1024}
    fields.update(over)
    store = MessageStore(load_config(env={}, **fields))  # type: ignore[arg-type]
    store.start()
    return store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = open_store(tmp_path / "s")
    yield s
    s.shutdown()


def half_message(body: bytes, key: str, group: str = "pg") -> Message:
    return Message("orders", body, tags="T", properties={
        TRAN_MSG: "true", PRODUCER_GROUP: group, PROPERTY_UNIQ_KEY: key}, sys_flag=0x4)


def put_half(store: MessageStore, body: bytes = b"h", key: str = "K1") -> MessageExt:
    result = store.put(half_message(body, key), 2)
    assert result.ok, result
    store.reput.catch_up()
    half = store.transactions.half_at(result.phy_offset)
    assert half is not None
    return half


def messages(store: MessageStore, topic: str, queue_id: int = 0) -> list[MessageExt]:
    store.reput.catch_up()
    got = store.get_message("g", topic, queue_id, 0, 100)
    return got.messages() if got.status is GetStatus.FOUND else []


def test_a_half_is_kept_from_consumers_until_its_commit(store: MessageStore) -> None:
    half = put_half(store)
    assert half.topic == HALF_TOPIC and half.queue_id == 0
    assert half.properties["REAL_TOPIC"] == "orders" and half.properties["REAL_QID"] == "2"
    assert half.properties[TRANSACTION_ID] == "K1"
    assert half.sys_flag & SYSFLAG_TRANSACTION_MASK == 0  # stored as NOT type
    assert messages(store, "orders", 2) == []
    result = store.transactions.end(half, COMMIT, HOST)
    assert result.conflict is None and result.pending is not None and result.pending.result.ok
    [real] = messages(store, "orders", 2)
    assert real.body == b"h" and real.tags == "T" and TRAN_MSG not in real.properties
    assert real.sys_flag & SYSFLAG_TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
    assert real.prepared_transaction_offset == half.commit_log_offset
    assert real.properties[HALF_ORIGIN] == str(half.commit_log_offset)
    assert messages(store, OP_TOPIC) == []  # the commit's op waits for its batch
    assert store.transactions.decided(half) == (COMMIT, True)
    store.transactions.flush_ops()
    [op] = messages(store, OP_TOPIC)
    assert op.tags == "d" and op.body == str(half.queue_offset).encode()
    assert op.properties[OP_STATE] == "COMMIT"
    assert records.op_origins(op) == [half.commit_log_offset]
    store.transactions.forget()  # found in the index now, not in memory
    assert store.transactions.decided(half) == (COMMIT, True)


def test_a_final_state_is_final(store: MessageStore) -> None:
    rolled, committed = put_half(store, b"r", "K1"), put_half(store, b"c", "K2")
    tx = store.transactions
    assert tx.end(rolled, ROLLBACK, HOST).pending is not None
    assert tx.end(committed, COMMIT, HOST).pending is not None
    # the other end: refused, nothing written; the same one again: nothing written
    assert tx.end(rolled, COMMIT, HOST) == (ROLLBACK, None)
    assert tx.end(committed, ROLLBACK, HOST) == (COMMIT, None)
    assert tx.end(rolled, ROLLBACK, HOST) == (None, None)
    assert tx.end(committed, COMMIT, HOST) == (None, None)
    assert [m.body for m in messages(store, "orders", 2)] == [b"c"]
    tx.flush_ops()
    assert len(messages(store, OP_TOPIC)) == 2
    assert tx.stats["refused_conflicts"] == 2 and tx.stats["repeated"] == 2


def test_an_end_cut_short_after_its_commit_is_finished_without_a_second_commit(
        tmp_path: Path) -> None:
    """The master died between the commit and the op: the commit is there, the op is not.
    A new end (a check's, after a restart: nothing in memory) writes the op only; the other
    end is refused."""
    root = tmp_path / "s"
    store = open_store(root)
    half = put_half(store)
    message, queue_id = records.committed(half)
    assert store.put(message, queue_id, HOST, half.born_timestamp).ok  # the commit alone
    store.shutdown()
    store = open_store(root)
    try:
        half = store.transactions.half_at(half.commit_log_offset)
        assert half is not None
        assert store.transactions.decided(half) == (COMMIT, False)
        assert store.transactions.end(half, ROLLBACK, HOST) == (COMMIT, None)
        assert store.transactions.end(half, COMMIT, HOST) == (None, None)  # the op: batched
        assert len(messages(store, "orders", 2)) == 1
        store.transactions.flush_ops()
        assert [m.properties[OP_STATE] for m in messages(store, OP_TOPIC)] == ["COMMIT"]
        assert store.transactions.stats["ops_repaired"] == 1
    finally:
        store.shutdown()


def test_a_state_is_found_after_a_restart_and_for_any_copy_of_the_half(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    half = put_half(store)
    copy = store.put(records.checked_again(half), 0, HOST, half.born_timestamp)  # a check's
    assert copy.ok
    store.reput.catch_up()
    assert store.transactions.end(half, ROLLBACK, HOST).pending is not None
    store.shutdown()
    store = open_store(root)
    try:
        again = store.transactions.half_at(copy.phy_offset)
        assert again is not None and records.origin_of(again) == half.commit_log_offset
        assert records.check_times(again) == 1
        assert store.transactions.decided(again) == (ROLLBACK, True)
        assert store.transactions.end(again, COMMIT, HOST) == (ROLLBACK, None)
    finally:
        store.shutdown()


def test_the_state_of_an_end_not_dispatched_yet_is_found(store: MessageStore) -> None:
    """An end written past the confirmed offset (controller mode, not acknowledged yet) is
    in no index: the look-up reads the records not dispatched."""
    half = put_half(store)
    store.confirm_phy_offset = store.dispatched_phy_offset  # reput stops here
    try:
        assert store.transactions.end(half, COMMIT, HOST).pending is not None
        store.transactions.flush_ops()
        store.transactions.forget()
        assert store.dispatched_phy_offset < store.commit_log.max_offset
        assert store.transactions.decided(half) == (COMMIT, True)
    finally:
        store.set_confirm_offset(None)


@pytest.mark.parametrize("what,message", [
    ("no group", Message("o", b"x", properties={TRAN_MSG: "true"})),
    ("a delay level", Message("o", b"x", properties={TRAN_MSG: "true", PRODUCER_GROUP: "g"},
                              delay_level=2)),
    ("a timer", Message("o", b"x", properties={TRAN_MSG: "true", PRODUCER_GROUP: "g",
                                               "TIMER_DELAY_SEC": "5"})),
])
def test_a_half_that_cannot_be_one_is_refused(store: MessageStore, what: str,
                                               message: Message) -> None:
    result = store.put(message, 0)
    assert result.status is PutStatus.MESSAGE_ILLEGAL, what
    assert messages(store, HALF_TOPIC) == []


def test_without_the_index_a_half_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", messageIndexEnable=False)
    try:
        result = store.put(half_message(b"x", "K"), 0)
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "messageIndexEnable" in result.remark
    finally:
        store.shutdown()


def test_a_transaction_the_memory_forgot_is_found_in_the_index(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A master skips the look-up for a transaction after its start that it did not end
    (every end since is its own, remembered); once the memory lets an end go, the shortcut
    stops below it: that transaction is looked up, and found."""
    from common.store.transaction import service

    monkeypatch.setattr(service, "RECENT", 2)
    halves = [put_half(store, b"m%d" % i, f"K{i}") for i in range(3)]
    tx = store.transactions
    for half in halves:
        assert tx.end(half, COMMIT, HOST).pending is not None
    fresh = tx.stats["fresh"]
    assert tx.decided(halves[0]) == (COMMIT, True)  # forgotten: from the index
    assert tx.end(halves[0], ROLLBACK, HOST) == (COMMIT, None)
    assert tx.stats["fresh"] == fresh
    late = put_half(store, b"late", "K9")
    assert tx.decided(late) == (None, False) and tx.stats["fresh"] == fresh + 1
    store.set_master_services(False)  # a slave now: ends may come by replication
    assert tx.decided(late) == (None, False) and tx.stats["fresh"] == fresh + 1


def test_a_backlog_of_ends_never_keeps_a_half_from_its_check(tmp_path: Path) -> None:
    """rmq#9500: RocketMQ reads ops in order into a map, and a backlog of them left halves
    unchecked. Here each half is looked up by its origin: of 300 halves, the 299 ended are
    passed and the one left open is checked, in one round."""
    store = open_store(tmp_path / "s", transactionTimeOut=0)
    try:
        halves = [put_half(store, b"%d" % i, f"K{i}") for i in range(300)]
        for half in halves[:150] + halves[151:]:
            store.transactions.end(half, ROLLBACK, HOST)
        asked: list[dict[str, object]] = []
        check: Any = _check_back(tmp_path, store, asked, groups=("pg",))
        assert check.check_round() == 300
        assert [f["commitLogOffset"] for f in asked] != [] and len(asked) == 1
        [real] = messages(store, "orders", 2)
        assert real.body == b"150"
        assert check.check_round() == 1  # the copy put back; decided now, passed
        assert len(asked) == 1
    finally:
        store.shutdown()


def test_commits_ops_are_batched_by_size_and_a_rollbacks_op_is_written_at_once(
        tmp_path: Path) -> None:
    """``transactionOpMsgMaxSize``: a commit's op waits until the batch's body (the halves'
    queue offsets joined by ``,``) reaches it, then one op record ends them all, each found
    by its origin; a rollback's op is written with its end."""
    store = open_store(tmp_path / "s", transactionOpMsgMaxSize=16,
                       transactionOpBatchInterval=3_600_000)
    try:
        halves = [put_half(store, b"%d" % i, f"K{i}") for i in range(10)]
        tx = store.transactions
        for half in halves[:7]:  # queue offsets 0..6: "0," .. "6,", 14 bytes
            assert tx.end(half, COMMIT, HOST).pending.result.ok  # type: ignore[union-attr]
        assert messages(store, OP_TOPIC) == []
        tx.end(halves[7], COMMIT, HOST)  # 16 bytes: written
        [batch] = messages(store, OP_TOPIC)
        assert batch.body == b"0,1,2,3,4,5,6,7" and batch.tags == "d"
        assert records.op_origins(batch) == [h.commit_log_offset for h in halves[:8]]
        tx.end(halves[8], ROLLBACK, HOST)
        ops = messages(store, OP_TOPIC)
        assert [m.properties[OP_STATE] for m in ops] == ["COMMIT", "ROLLBACK"]
        assert records.op_origins(ops[1]) == [halves[8].commit_log_offset]
        tx.forget()
        assert [tx.decided(h) for h in halves[:9]] == [(COMMIT, True)] * 8 + [(ROLLBACK, True)]
        assert tx.decided(halves[9]) == (None, False)
        assert tx.stats["op_batches"] == 1
    finally:
        store.shutdown()


def test_a_batch_is_written_its_interval_after_its_first_op(tmp_path: Path) -> None:
    """``transactionOpBatchInterval``: the master's batcher writes a batch that never fills."""
    import time

    store = open_store(tmp_path / "s", transactionOpBatchInterval=200)
    try:
        half = put_half(store)
        started = time.monotonic()
        store.transactions.end(half, COMMIT, HOST)
        deadline = started + 10
        while not messages(store, OP_TOPIC) and time.monotonic() < deadline:
            time.sleep(0.02)
        [op] = messages(store, OP_TOPIC)
        assert time.monotonic() - started >= 0.2
        assert records.op_origins(op) == [half.commit_log_offset]
    finally:
        store.shutdown()


def test_a_batch_lost_to_a_crash_loses_no_decision(tmp_path: Path) -> None:
    """The master died with commits' ops still batched: each commit still decides its
    transaction (a rollback after it is refused), and the end a check-back makes writes the
    op, once."""
    root = tmp_path / "s"
    store = open_store(root, transactionOpBatchInterval=3_600_000)
    half = put_half(store)
    assert store.transactions.end(half, COMMIT, HOST).pending is not None
    store.shutdown()  # stops the batcher: the batch is dropped, as a crash would lose it
    assert store.transactions.stats["ops_dropped"] == 1
    store = open_store(root, transactionOpBatchInterval=3_600_000)
    try:
        tx = store.transactions
        half = tx.half_at(half.commit_log_offset)
        assert half is not None and messages(store, OP_TOPIC) == []
        assert tx.decided(half) == (COMMIT, False)
        assert tx.end(half, ROLLBACK, HOST) == (COMMIT, None)
        assert tx.end(half, COMMIT, HOST).conflict is None
        tx.flush_ops()
        assert len(messages(store, OP_TOPIC)) == 1 and len(messages(store, "orders", 2)) == 1
        assert tx.stats["ops_repaired"] == 1
    finally:
        store.shutdown()


def test_a_half_sent_twice_is_committed_once(store: MessageStore) -> None:
    """The client's retry of a half whose answer was lost (a failover) stores a second half
    with the same transaction id: a commit of either decides the other, so the transaction is
    consumed once. The other's end writes its op only; a rollback of it is refused."""
    tx = store.transactions
    first, second = put_half(store, b"x", "T1"), put_half(store, b"x", "T1")
    assert records.origin_of(first) != records.origin_of(second)
    assert tx.end(first, COMMIT, HOST).pending is not None
    assert tx.decided(second) == (COMMIT, False)
    assert tx.end(second, ROLLBACK, HOST) == (COMMIT, None)
    assert tx.end(second, COMMIT, HOST).conflict is None
    assert tx.decided(second) == (COMMIT, True)
    tx.flush_ops()
    assert [m.body for m in messages(store, "orders", 2)] == [b"x"]
    assert tx.stats["halves_sent_twice"] >= 1 and tx.stats["commits"] == 1
    # the same uniq key from another producer group, or with another body (an application
    # that reused the id): other transactions, committed on their own
    reused = put_half(store, b"z", "T1")
    assert tx.decided(reused) == (None, False)
    assert tx.end(reused, COMMIT, HOST).pending is not None
    other = store.put(half_message(b"y", "T1", group="pg2"), 2)
    assert other.ok
    store.reput.catch_up()
    half = tx.half_at(other.phy_offset)
    assert half is not None and tx.decided(half) == (None, False)
    assert tx.end(half, COMMIT, HOST).pending is not None
    assert [m.body for m in messages(store, "orders", 2)] == [b"x", b"z", b"y"]


def test_a_half_sent_twice_finds_a_commit_not_dispatched_yet(store: MessageStore) -> None:
    """The commit of the first half is past the confirmed offset (not indexed): the second
    half's end finds it in the records not dispatched."""
    tx = store.transactions
    first, second = put_half(store, b"x", "T1"), put_half(store, b"x", "T1")
    store.confirm_phy_offset = store.dispatched_phy_offset  # reput stops here
    try:
        assert tx.end(first, COMMIT, HOST).pending is not None
        tx.forget()  # nothing in memory: only the records tell
        assert store.dispatched_phy_offset < store.commit_log.max_offset
        assert tx.decided(second) == (COMMIT, False)
    finally:
        store.set_confirm_offset(None)
    assert tx.end(second, COMMIT, HOST).conflict is None
    assert len(messages(store, "orders", 2)) == 1


def test_a_half_sent_twice_across_a_restart_is_committed_once(tmp_path: Path) -> None:
    """The first half committed by the master before a failover (indexed); the second,
    stored after the new master took over (a fresh half, which skips its own look-up),
    still finds that commit."""
    root = tmp_path / "s"
    store = open_store(root)
    first = put_half(store, b"x", "T1")
    assert store.transactions.end(first, COMMIT, HOST).pending is not None
    store.transactions.flush_ops()
    store.shutdown()
    store = open_store(root)
    try:
        tx = store.transactions
        second = put_half(store, b"x", "T1")
        fresh = tx.stats["fresh"]
        assert tx.decided(second) == (COMMIT, False)
        assert tx.stats["fresh"] == fresh + 1  # the shortcut was taken, and still found it
        assert tx.end(second, COMMIT, HOST).conflict is None
        assert len(messages(store, "orders", 2)) == 1
    finally:
        store.shutdown()


def _check_back(tmp_path: Path, store: MessageStore, asked: list[dict[str, object]],
                clock: object = None, groups: tuple[str, ...] = ("slow", "fast", "other")
                ) -> object:
    """A check-back whose producers (one a group) answer COMMIT to every check (each recorded
    in asked)."""
    import concurrent.futures
    import time

    from common.broker.producer_groups import ProducerGroups
    from common.broker.tables import ConsumerOffsetTable
    from common.format.protocol import Response
    from master.transaction_check import TransactionCheck

    producers = ProducerGroups()
    for group in groups:
        producers.heartbeat(group, "app", group.encode(), "10.0.0.1:1")

    def ask(identity: bytes, code: object, fields: dict[str, object], bodies: object = (),
            timeout_ms: int = 0) -> concurrent.futures.Future[Response]:
        asked.append(fields)
        future: concurrent.futures.Future[Response] = concurrent.futures.Future()
        future.set_result(Response(0, 0, "", {"state": "COMMIT"}, []))  # type: ignore[arg-type]
        return future

    (tmp_path / "config").mkdir(exist_ok=True)
    return TransactionCheck(store.cfg, store, producers, ask,  # type: ignore[arg-type]
                            ConsumerOffsetTable(tmp_path / "config"),
                            clock=clock or time.time)  # type: ignore[arg-type]


def _put_group_half(store: MessageStore, group: str, born_timestamp: int = 0,
                    **props: str) -> MessageExt:
    msg = half_message(group.encode(), "K" + group, group)
    msg.properties.update(props)
    result = store.put(msg, 2, HOST, born_timestamp)
    assert result.ok, result
    store.reput.catch_up()
    half = store.transactions.half_at(result.phy_offset)
    assert half is not None
    return half


@pytest.mark.parametrize("immunity", ["999999999", "9" * 5000])
def test_a_half_immune_for_long_holds_up_no_later_half(tmp_path: Path, immunity: str) -> None:
    """A half whose CHECK_IMMUNITY_TIME_IN_SECONDS is huge is put back at the end of the half
    queue, unchecked, and the round goes on to the halves of other groups after it; it is
    checked once the capped immunity is over."""
    import time

    from common.core.transaction import CHECK_IMMUNITY_SECONDS, CHECK_TIMES
    from master.transaction_check import MAX_IMMUNITY_MS

    store = open_store(tmp_path / "s", transactionTimeOut=0)
    try:
        held = _put_group_half(store, "slow", **{CHECK_IMMUNITY_SECONDS: immunity})
        _put_group_half(store, "other")
        asked: list[dict[str, object]] = []
        check: Any = _check_back(tmp_path, store, asked)
        check.check_round()
        assert [f["producerGroup"] for f in asked] == ["other"]
        assert check.stats["held"] == 1 and check.stats["checks"] == 1
        [committed] = messages(store, "orders", 2)
        assert committed.body == b"other"
        check.check_round()  # the held copy, put back again; the other's copy is decided
        assert len(asked) == 1 and check.stats["held"] == 2
        held_copies = [c for c in messages(store, HALF_TOPIC)[2:] if c.body == b"slow"]
        assert [records.origin_of(c) for c in held_copies] == [held.commit_log_offset] * 2
        assert not any(CHECK_TIMES in c.properties for c in held_copies)  # not checked

        later = time.time() + MAX_IMMUNITY_MS / 1000 + 1  # the cap is over: checked
        check.clock = lambda: later
        check.check_round()
        assert [f["producerGroup"] for f in asked] == ["other", "slow"]
    finally:
        store.shutdown()


def test_a_half_born_in_the_future_is_aged_by_its_store_time(tmp_path: Path) -> None:
    """A client-set born time years ahead neither keeps its half from its check nor ends the
    round before the halves after it: a half's age is taken from its store time."""
    import time

    store = open_store(tmp_path / "s", transactionTimeOut=0)
    try:
        future_ms = int(time.time() * 1000) + 10 * 365 * 86_400_000
        _put_group_half(store, "fast", born_timestamp=future_ms)
        _put_group_half(store, "other")
        asked: list[dict[str, object]] = []
        check: Any = _check_back(tmp_path, store, asked)
        check.check_round()
        assert sorted(str(f["producerGroup"]) for f in asked) == ["fast", "other"]
    finally:
        store.shutdown()



@contextlib.contextmanager
def reput_held(store: MessageStore) -> Iterator[None]:
    """Reput stops at the confirmed offset (controller mode: a new master's tail, replicated
    and not yet acknowledged by the other members) until the block ends."""
    store.confirm_phy_offset = store.dispatched_phy_offset
    try:
        yield
    finally:
        store.set_confirm_offset(None)


def dispatch_after_index_query(store: MessageStore, n: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Reput dispatches (and indexes) what it held right after the ``n``-th index query from
    now returns: the thread switch that lets a look-up miss a record dispatched between its
    index query and its read of the records not dispatched."""
    assert store.index is not None
    query = store.index.query
    calls = 0

    def query_then_dispatch(*args: Any) -> list[int]:
        nonlocal calls
        found = query(*args)
        calls += 1
        if calls == n:
            store.set_confirm_offset(None)
            store.reput.catch_up()
        return found

    monkeypatch.setattr(store.index, "query", query_then_dispatch)


@pytest.mark.parametrize("n", [1, 2])
def test_an_end_finds_a_commit_dispatched_during_its_look_up(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """A new master meets the commit of another (replicated, past its confirmed offset)
    while reput dispatches it: wherever the dispatch falls in an END's look-up, the END
    finds the commit (and its op) and writes nothing. A half without a uniq key: only its
    origin tells."""
    tx = store.transactions
    result = store.put(Message("orders", b"x", properties={TRAN_MSG: "true",
                                                           PRODUCER_GROUP: "pg"}), 2)
    assert result.ok
    store.reput.catch_up()
    half = tx.half_at(result.phy_offset)
    assert half is not None and PROPERTY_UNIQ_KEY not in half.properties
    with reput_held(store):
        assert tx.end(half, COMMIT, HOST).pending is not None
        tx.flush_ops()
        tx.forget()  # the new master: nothing in memory, its look-ups read the log
        assert store.dispatched_phy_offset < store.commit_log.max_offset
        dispatch_after_index_query(store, n, monkeypatch)
        assert tx.end(half, COMMIT, HOST) == (None, None)
    assert [m.body for m in messages(store, "orders", 2)] == [b"x"]
    assert tx.stats["commits"] == 1 and tx.stats["repeated"] == 1


def test_a_half_sent_twice_finds_the_other_commit_dispatched_during_its_look_up(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first half committed by the old master (past the new master's confirmed offset),
    the second stored on the new master (the fresh shortcut: only the look-up by
    transaction id): reput dispatches the first commit during that look-up, which finds it
    all the same."""
    tx = store.transactions
    first = put_half(store, b"x", "T1")
    with reput_held(store):
        assert tx.end(first, COMMIT, HOST).pending is not None
        tx.flush_ops()
        store.set_master_services(False)  # the new master: nothing in memory, and every
        tx.forget()  # half stored from the log's end on is its own
        store.set_master_services(True)
        second = put_half(store, b"x", "T1")
        fresh = tx.stats["fresh"]
        dispatch_after_index_query(store, 1, monkeypatch)
        assert tx.end(second, COMMIT, HOST).conflict is None
        assert tx.stats["fresh"] == fresh + 1
    assert [m.body for m in messages(store, "orders", 2)] == [b"x"]
    assert tx.stats["commits"] == 1 and tx.stats["halves_sent_twice"] == 1


def test_a_half_too_large_to_put_back_holds_up_no_later_half(tmp_path: Path) -> None:
    """A half whose properties sit at the store's limit is held, but its checked copy (one
    more CHECK_TIMES, its origin) is refused for its size: the round goes on past it to the
    halves of other groups, and it is counted. Every round ended at it, and progress never
    passed it: no later half of any group was ever checked."""
    from common.format.record import MAX_PROPERTIES_BYTES

    store = open_store(tmp_path / "s", transactionTimeOut=0)
    try:
        for size in range(MAX_PROPERTIES_BYTES - 64, 0, -1):
            msg = half_message(b"big", "Kbig", "slow")
            msg.properties["fill"] = "x" * size
            if store.put(msg, 2, HOST).ok:
                break
        store.reput.catch_up()
        _put_group_half(store, "other")
        asked: list[dict[str, object]] = []
        check: Any = _check_back(tmp_path, store, asked)
        check.check_round()
        assert [f["producerGroup"] for f in asked] == ["other"]
        assert check.stats["unmovable"] == 1
        check.check_round()  # passed for good: not met again
        assert check.stats["unmovable"] == 1
    finally:
        store.shutdown()


@pytest.mark.parametrize("noise_key", ["T1", "SP"])  # the uniq key itself; one of its hash
def test_keys_of_a_senders_choosing_hide_no_commit_from_the_look_up(
        tmp_path: Path, noise_key: str) -> None:
    """A half sent again after a restart is found committed by its first copy's commit, looked
    up in the index by the uniq key: any producer of the topic can index as many records as it
    likes under that key, or under another of the same Java hash, newer than the commit. The
    look-up read only the 16 newest hits: the half was taken as undecided, and the check-back
    committed it again (a duplicate)."""
    root = tmp_path / "s"
    store = open_store(root)
    first = put_half(store, b"x", "T1")
    assert store.transactions.end(first, COMMIT, HOST).pending is not None
    store.transactions.flush_ops()
    for i in range(40):
        assert store.put(Message("orders", b"noise%d" % i, keys=noise_key), 2).ok
    store.reput.catch_up()
    store.shutdown()
    store = open_store(root)
    try:
        second = put_half(store, b"x", "T1")
        assert store.transactions.decided(second) == (COMMIT, False)
    finally:
        store.shutdown()
