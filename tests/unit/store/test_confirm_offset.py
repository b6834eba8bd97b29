"""The confirmed offset (RocketMQ 5's confirmOffset): what consumers may be served.

On a real store: reput dispatches nothing past it, so no pull, long poll, look-up or delayed
delivery sees it; raising it uncovers the records at once; a restart in controller mode keeps
an unconfirmed tail hidden, and a store that becomes master hands out none of that tail's queue
offsets again. On the HA cores and frames: the master carries it to the slaves in DATA and
HEARTBEAT frames, and tells a caught-up slave within CONFIRM_NOTICE_MS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.core.config import BrokerConfig, load_config
from common.core.errors import GetStatus
from common.core.message import Message
from common.ha import master_core as mc
from common.ha import slave_core as sc
from common.ha.epochs import EpochEntry as E
from common.ha.protocol import (
    NO_OFFSET,
    Data,
    Heartbeat,
    Hello,
    HelloReply,
    Limits,
    decode,
    encode,
    encode_header,
)
from common.pipeline.stream import safe_end
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _store(root: Path, controller: bool = True) -> MessageStore:
    return MessageStore(load_config(env={}, storePathRootDir=str(root),
                                    mappedFileSizeCommitLog=64 * 1024,
                                    mappedFileSizeConsumeQueue=20 * 1024,
                                    enableControllerMode=controller,
                                    controllerAddr="127.0.0.1:2181" if controller else "",
                                    brokerId=1 if controller else 0))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = _store(tmp_path)
    s.start()
    yield s
    s.shutdown()


def _bodies(store: MessageStore, queue_offset: int = 0) -> list[bytes]:
    got = store.get_message("g", "t", 0, queue_offset, 32)
    return [m.body for m in got.messages()]


def test_nothing_past_the_confirmed_offset_is_dispatched_or_found(store: MessageStore) -> None:
    first = store.put(Message("t", b"a", keys="ka"), 0)
    store.set_confirm_offset(first.end_phy_offset)
    second = store.put(Message("t", b"b", keys="kb"), 0)
    store.reput.catch_up()
    assert _bodies(store) == [b"a"]
    assert store.max_queue_offset("t", 0) == 1
    assert store.get_message("g", "t", 0, 1, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert store.message_by_offset(second.phy_offset) is None
    assert store.record_at(second.phy_offset) is None
    assert store.query_by_key("t", "kb") == []
    assert store.snapshot().confirm_phy_offset == first.end_phy_offset
    arrivals: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda *a: arrivals.append(a))
    store.set_confirm_offset(second.end_phy_offset)
    store.reput.catch_up()
    assert _bodies(store) == [b"a", b"b"]
    assert arrivals == [("t", 0, 2)]  # a parked long poll wakes
    assert [m.body for m in store.query_by_key("t", "kb")] == [b"b"]
    store.set_confirm_offset(None)
    third = store.put(Message("t", b"c"), 0)
    assert store.wait_dispatched(third.end_phy_offset)
    assert _bodies(store) == [b"a", b"b", b"c"]


def test_the_confirmed_offset_never_hides_what_was_served(store: MessageStore) -> None:
    done = store.put(Message("t", b"a"), 0)
    store.set_confirm_offset(done.end_phy_offset)
    store.reput.catch_up()
    store.set_confirm_offset(0)
    assert store.confirm_phy_offset == done.end_phy_offset
    assert _bodies(store) == [b"a"]


def test_a_write_confirmed_later_is_still_dispatched_from_its_digest(store: MessageStore) -> None:
    store.set_confirm_offset(0)
    puts = [store.put(Message("t", b"m%d" % i), 0) for i in range(5)]
    store.reput.do_reput()  # nothing confirmed: the digests must stay for later
    assert len(store.commit_log.digests) == 5
    store.set_confirm_offset(puts[-1].end_phy_offset)
    store.reput.do_reput()
    assert len(store.commit_log.digests) == 0
    assert _bodies(store) == [b"m%d" % i for i in range(5)]


def test_a_restart_keeps_the_unconfirmed_tail_hidden_and_its_queue_offsets_taken(
        tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.start()
    confirmed = s.put(Message("t", b"a"), 0)
    s.set_confirm_offset(confirmed.end_phy_offset)
    s.put(Message("t", b"b"), 0)
    s.put(Message("u", b"x"), 3)
    s.reput.catch_up()
    s.shutdown()
    again = _store(tmp_path)
    again.start()
    try:
        assert again.confirm_phy_offset == confirmed.end_phy_offset
        assert _bodies(again) == [b"a"]
        again.become_master()  # controller mode: the HA service decides what is confirmed
        assert _bodies(again) == [b"a"]
        after = again.put(Message("t", b"c"), 0)
        assert after.queue_offset == 2  # not 1: the unconfirmed "b" holds it
        assert again.put(Message("u", b"y"), 3).queue_offset == 1
        again.set_confirm_offset(None)
        assert again.wait_dispatched(after.end_phy_offset)
        assert _bodies(again) == [b"a", b"b", b"c"]
    finally:
        again.shutdown()


def test_without_the_controller_nothing_is_held_back(tmp_path: Path) -> None:
    s = _store(tmp_path, controller=False)
    s.start()
    try:
        assert s.confirm_phy_offset is None
        done = s.put(Message("t", b"a"), 0)
        assert s.wait_dispatched(done.end_phy_offset)
        s.become_slave()
        assert s.confirm_phy_offset is None
    finally:
        s.shutdown()


# ---- frames -----------------------------------------------------------------------------------
def test_data_and_heartbeat_carry_the_confirmed_offset_and_older_frames_decode() -> None:
    limits = Limits()
    data = Data(1, 2, 0, 10, b"abc", 7)
    assert decode(encode(data), limits) == data
    beat = Heartbeat(1, 2, 100, 90, 80)
    assert decode([encode_header(beat)], limits) == beat
    import msgpack

    old_data = [msgpack.packb([3, 1, 2, 0, 10, 3]), b"abc"]
    assert decode(old_data, limits).confirm_offset == NO_OFFSET  # type: ignore[union-attr]
    old_beat = [msgpack.packb([5, 1, 2, 100, 90])]
    assert decode(old_beat, limits).confirm_offset == NO_OFFSET  # type: ignore[union-attr]


# ---- cores ------------------------------------------------------------------------------------
def _cfg() -> BrokerConfig:
    return BrokerConfig(brokerName="b", haTransferBatchSize=100, haWindowBytes=300,  # type: ignore[arg-type]
                        mappedFileSizeCommitLog=1024, haSendHeartbeatInterval=1000,
                        haHousekeepingInterval=5000)


def test_the_master_tells_a_caught_up_slave_of_a_new_confirmed_offset_soon() -> None:
    m = mc.MasterCore(_cfg(), (E(1, 0),), 0, 100, now_ms=0)
    actions = m.on_hello(b"p", Hello(1, "b", 1, 0, "s:1", ()), now_ms=0)
    reads = [a for a in actions if isinstance(a, mc.ReadAndSend)]
    assert [r.confirm_offset for r in reads] == [NO_OFFSET]
    m.set_confirm_offset(100)
    assert m.next_deadline_ms() == mc.CONFIRM_NOTICE_MS  # not the 1 s heartbeat
    assert m.tick(mc.CONFIRM_NOTICE_MS - 1) == []
    beats = [decode(a.frames, Limits()) for a in m.tick(mc.CONFIRM_NOTICE_MS)
             if isinstance(a, mc.Send)]
    assert beats == [Heartbeat(1, 1, 100, 100, 100)]
    assert m.next_deadline_ms() == mc.CONFIRM_NOTICE_MS + 1000  # told: back to heartbeats


def test_the_slave_core_reports_its_masters_confirmed_offset_per_session() -> None:
    s = sc.SlaveCore(_cfg(), 0, (), first_session=5, now_ms=0)
    s.start(0)
    s.on_hello_reply(HelloReply(5, 1, 0, 0, 0, (E(1, 0),)), now_ms=1)
    assert s.master_confirm is None
    s.on_data(Data(5, 1, 0, 0, b"abc", 2), now_ms=2)
    assert s.master_confirm == 2
    s.on_heartbeat(Heartbeat(5, 1, 3, 3, 3), now_ms=3)
    assert s.master_confirm == 3
    s.resync("test", now_ms=4)
    s.on_hello_reply(HelloReply(6, 1, 0, 3, 3, (E(1, 0),)), now_ms=5)
    assert s.master_confirm is None  # a new master may confirm less


def test_a_stream_reads_no_further_than_the_confirmed_offset() -> None:
    status = {"flushedPhyOffset": 500, "dispatchedPhyOffset": 400, "confirmPhyOffset": 300,
              "slaves": [{"ackOffset": 450, "inSync": True}]}
    assert safe_end(status) == 300
    del status["confirmPhyOffset"]
    assert safe_end(status) == 400
