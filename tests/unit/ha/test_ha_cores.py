"""MasterCore, SlaveCore and GroupTransferCore driven input by input (no sockets, no clock)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from common.core.config import BrokerConfig
from common.core.errors import ConfigError, ResponseCode
from common.format import record
from common.ha import master_core as mc
from common.ha import slave_core as sc
from common.ha.epochs import EpochEntry as E
from common.ha.group_transfer_core import Admission, GroupTransferCore, needed_acks
from common.ha.protocol import (
    NO_OFFSET,
    Ack,
    Data,
    Error,
    Frame,
    Heartbeat,
    Hello,
    HelloReply,
    Limits,
    decode,
)

pytestmark = pytest.mark.unit

HB_MS = 1000
HK_MS = 5000
P1 = b"peer-1"
P2 = b"peer-2"


def _cfg(**overrides: object) -> BrokerConfig:
    values: dict[str, object] = {
        "brokerName": "b", "haTransferBatchSize": 100, "haWindowBytes": 300,
        "mappedFileSizeCommitLog": 1024, "haSendHeartbeatInterval": HB_MS,
        "haHousekeepingInterval": HK_MS, "haMaxGapNotInSync": 10_000, "slaveTimeout": 3000,
    }
    values.update(overrides)
    return BrokerConfig(**values)  # type: ignore[arg-type]


def _frame(frames: Sequence[bytes | memoryview]) -> Frame:
    return decode(frames, Limits(max_data_bytes=1 << 20))


def _sent(actions: Sequence[object]) -> list[Frame]:
    """Frames of the Send / SendToMaster actions, decoded."""
    return [_frame(a.frames) for a in actions if isinstance(a, mc.Send | sc.SendToMaster)]


def _of(actions: Sequence[object], kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def _hello(session: int = 1, max_phy_offset: int = 0, history: tuple[E, ...] = (),
           broker_id: int = 1, name: str = "b") -> Hello:
    return Hello(session, name, broker_id, max_phy_offset, f"10.0.0.{broker_id}:10911", history)


def _master(max_phy_offset: int = 0, history: tuple[E, ...] = (E(1, 0),), min_phy_offset: int = 0,
            **overrides: object) -> mc.MasterCore:
    return mc.MasterCore(_cfg(**overrides), history, min_phy_offset, max_phy_offset, now_ms=0)


# ---- MasterCore: handshake -------------------------------------------------------------------
def test_empty_slave_gets_a_reply_and_a_window_of_data() -> None:
    m = _master(max_phy_offset=1000)
    actions = m.on_hello(P1, _hello(), now_ms=10)
    reply = _sent(actions)[0]
    # the master says where it serves clients: the slave reports it as masterAddress
    assert reply == HelloReply(1, 1, 0, 1000, 0, (E(1, 0),), _cfg().client_address)
    reads = _of(actions, mc.ReadAndSend)
    assert [(r.phy_offset, r.length) for r in reads] == [(0, 100), (100, 100), (200, 100)]
    assert all((r.peer_id, r.session, r.epoch, r.epoch_start_phy_offset) == (P1, 1, 1, 0)
               for r in reads)


def test_data_ranges_never_cross_a_segment_or_an_epoch_boundary() -> None:
    m = _master(max_phy_offset=3000, history=(E(1, 0), E(2, 950), E(4, 1100)),
                haWindowBytes=10_000, haTransferBatchSize=400)
    reads = _of(m.on_hello(P1, _hello(), now_ms=0), mc.ReadAndSend)
    spans = [(r.phy_offset, r.length, r.epoch, r.epoch_start_phy_offset) for r in reads]
    assert spans == [(0, 400, 1, 0), (400, 400, 1, 0), (800, 150, 1, 0), (950, 74, 2, 950),
                     (1024, 76, 2, 950), (1100, 400, 4, 1100), (1500, 400, 4, 1100),
                     (1900, 148, 4, 1100), (2048, 400, 4, 1100), (2448, 400, 4, 1100),
                     (2848, 152, 4, 1100)]


def test_read_and_send_builds_the_data_frame_and_checks_the_length() -> None:
    action = mc.ReadAndSend(P1, 7, 2, 50, 60, 3)
    assert _frame(action.frames(b"abc")) == Data(7, 2, 50, 60, b"abc")
    with pytest.raises(ValueError, match="read 2 bytes"):
        action.frames(b"ab")


def test_slave_prefix_resumes_at_its_own_max() -> None:
    m = _master(max_phy_offset=1000)
    actions = m.on_hello(P1, _hello(max_phy_offset=640, history=(E(1, 0),)), now_ms=0)
    assert _sent(actions)[0].start_phy_offset == 640  # type: ignore[union-attr]
    assert _of(actions, mc.ReadAndSend)[0].phy_offset == 640


def test_divergent_slave_is_told_to_truncate_at_the_epoch_boundary() -> None:
    m = _master(max_phy_offset=2000, history=(E(1, 0), E(2, 600)))
    actions = m.on_hello(P1, _hello(max_phy_offset=900, history=(E(1, 0),)), now_ms=0)
    reply = _sent(actions)[0]
    assert isinstance(reply, HelloReply) and reply.start_phy_offset == 600
    assert _of(actions, mc.ReadAndSend)[0] == mc.ReadAndSend(P1, 1, 2, 600, 600, 100)
    assert m.slaves()[0].ack_offset == 600


def test_divergent_slave_beyond_the_master_max_is_also_told_where_to_truncate() -> None:
    m = _master(max_phy_offset=700, history=(E(1, 0), E(2, 600)))
    reply = _sent(m.on_hello(P1, _hello(max_phy_offset=5000, history=(E(1, 0),)), now_ms=0))[0]
    assert isinstance(reply, HelloReply) and reply.start_phy_offset == 600


def test_slave_ahead_in_the_masters_own_epoch_gets_out_of_range_not_truncation() -> None:
    m = _master(max_phy_offset=700, history=(E(1, 0), E(2, 600)))
    actions = m.on_hello(P1, _hello(max_phy_offset=800, history=(E(1, 0), E(2, 600))), now_ms=0)
    error = _sent(actions)[0]
    assert isinstance(error, Error) and error.code is ResponseCode.OFFSET_OUT_OF_RANGE
    assert error.phy_offset == 700 and "beyond master max" in error.reason
    assert not _of(actions, mc.ReadAndSend) and m.slaves() == ()


def test_slave_below_the_masters_min_gets_out_of_range_with_the_min() -> None:
    m = _master(max_phy_offset=5000, min_phy_offset=2048)
    error = _sent(m.on_hello(P1, _hello(max_phy_offset=1000, history=(E(1, 0),)), now_ms=0))[0]
    assert isinstance(error, Error) and error.code is ResponseCode.OFFSET_OUT_OF_RANGE
    assert error.phy_offset == 2048 and "wipe" in error.reason
    assert m.slaves() == ()


def test_empty_slave_starts_at_the_masters_min() -> None:
    m = _master(max_phy_offset=5000, min_phy_offset=2048)
    actions = m.on_hello(P1, _hello(), now_ms=0)
    assert _sent(actions)[0].start_phy_offset == 2048  # type: ignore[union-attr]
    assert _of(actions, mc.ReadAndSend)[0].phy_offset == 2048


def test_slave_with_a_newer_epoch_fences_the_master() -> None:
    m = _master(max_phy_offset=100)
    actions = m.on_hello(P1, _hello(max_phy_offset=50, history=(E(1, 0), E(2, 40))), now_ms=0)
    error = _sent(actions)[0]
    assert isinstance(error, Error) and error.code is ResponseCode.STALE_EPOCH
    assert _of(actions, mc.Fenced) == [mc.Fenced(P1, 2, error.reason)]


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        (_hello(name="other"), ResponseCode.BAD_REQUEST),
        (_hello(broker_id=0), ResponseCode.BAD_REQUEST),
        (dataclasses.replace(_hello(), version=2), ResponseCode.VERSION_NOT_SUPPORTED),
    ],
)
def test_bad_hellos_are_refused(hello: Hello, code: ResponseCode) -> None:
    error = _sent(_master(100).on_hello(P1, hello, now_ms=0))[0]
    assert isinstance(error, Error) and error.code is code and error.session == hello.session


def test_duplicate_and_older_hellos_are_ignored_newer_ones_replace() -> None:
    m = _master(max_phy_offset=1000)
    m.on_hello(P1, _hello(session=5), now_ms=0)
    assert m.on_hello(P1, _hello(session=5), now_ms=0) == []
    assert m.on_hello(P2, _hello(session=4), now_ms=0) == []  # same broker, older handshake
    actions = m.on_hello(P2, _hello(session=6, max_phy_offset=300, history=(E(1, 0),)), now_ms=0)
    assert actions[0] == mc.Drop(P1, "replaced by a newer handshake")
    assert [s.peer_id for s in m.slaves()] == [P2]


def test_peer_limit() -> None:
    m = mc.MasterCore(_cfg(), (E(1, 0),), 0, 100, now_ms=0, max_peers=1)
    m.on_hello(P1, _hello(broker_id=1), now_ms=0)
    error = _sent(m.on_hello(P2, _hello(broker_id=2), now_ms=0))[0]
    assert isinstance(error, Error) and error.code is ResponseCode.SYSTEM_BUSY


# ---- MasterCore: acks, window, housekeeping --------------------------------------------------
def test_acks_advance_and_refill_the_window() -> None:
    m = _master(max_phy_offset=1000)
    m.on_hello(P1, _hello(), now_ms=0)
    assert m.on_log_advanced(1000) == []  # window (300) full
    actions = m.on_ack(P1, Ack(1, 150), now_ms=5)
    assert actions[0] == mc.AcksAdvanced(P1, 150)
    assert [(r.phy_offset, r.length) for r in _of(actions, mc.ReadAndSend)] == [(300, 100),
                                                                                (400, 50)]
    snap = m.slaves()[0]
    assert (snap.ack_offset, snap.next_phy_offset, snap.lag_bytes) == (150, 450, 850)
    assert m.on_ack(P1, Ack(1, 150), now_ms=6) == []  # a heartbeat ack: nothing new


def test_flow_control_sends_at_most_two_batches_at_once_and_keeps_the_rate() -> None:
    m = _master(max_phy_offset=100_000, haWindowBytes=50_000, haFlowControlEnable=True,
                maxHaTransferByteInSecond=30_000)  # 30 bytes a ms; batches of 100
    reads = _of(m.on_hello(P1, _hello(), now_ms=10), mc.ReadAndSend)
    assert [(r.phy_offset, r.length) for r in reads] == [(0, 100), (100, 100)]  # a full bucket
    assert m.next_deadline_ms() == 14  # 100 bytes more at 30 a ms: ceil(3.3) ms later
    assert _of(m.on_ack(P1, Ack(1, 200), now_ms=12), mc.ReadAndSend) == []  # held back
    assert _of(m.tick(13), mc.ReadAndSend) == []  # 90 bytes: no sliver of a frame
    more = _of(m.tick(14), mc.ReadAndSend)
    assert [(r.phy_offset, r.length) for r in more] == [(200, 100)]
    # a second of ticks at each deadline: the configured rate, one frame at a time
    sent, t, largest = 300, 14, 0
    while t < 1014:
        t = m.next_deadline_ms()
        actions = m.on_ack(P1, Ack(1, sent), now_ms=t) + m.tick(t)
        burst = sum(r.length for r in _of(actions, mc.ReadAndSend))
        largest = max(largest, burst)
        sent += burst
    assert 30_000 - 100 <= sent - 200 <= 30_000 + 100
    assert largest <= 200
    # idle: the bucket fills to two batches, never more
    m2 = _master(max_phy_offset=0, haFlowControlEnable=True, maxHaTransferByteInSecond=30_000)
    m2.on_hello(P1, _hello(), now_ms=0)
    reads = _of(m2.on_log_advanced(1000), mc.ReadAndSend)
    assert sum(r.length for r in reads) == 200


def test_without_flow_control_the_window_alone_limits() -> None:
    m = _master(max_phy_offset=100_000, haWindowBytes=50_000, maxHaTransferByteInSecond=3000)
    reads = _of(m.on_hello(P1, _hello(), now_ms=10), mc.ReadAndSend)
    assert sum(r.length for r in reads) == 50_000
    assert m.next_deadline_ms() == 10 + HB_MS


def test_flow_control_rate_must_allow_a_batch_per_slice() -> None:
    with pytest.raises(ConfigError, match="maxHaTransferByteInSecond"):
        _cfg(haFlowControlEnable=True, maxHaTransferByteInSecond=9999,
             mappedFileSizeCommitLog=4096).validate()


def test_impossible_ack_drops_the_peer() -> None:  # RocketMQ #3015
    m = _master(max_phy_offset=1000)
    m.on_hello(P1, _hello(), now_ms=0)
    actions = m.on_ack(P1, Ack(1, 301), now_ms=0)  # only 300 were sent
    error = _sent(actions)[0]
    assert isinstance(error, Error) and "impossible ack 301" in error.reason
    assert _of(actions, mc.Drop) and m.slaves() == () and m.in_sync_count() == 0


def test_ack_going_backwards_is_refused_and_counted() -> None:
    m = _master(max_phy_offset=1000)
    m.on_hello(P1, _hello(), now_ms=0)
    m.on_ack(P1, Ack(1, 200), now_ms=1)
    assert m.on_ack(P1, Ack(1, 100), now_ms=2) == []
    snap = m.slaves()[0]
    assert (snap.ack_offset, snap.refused_acks, snap.last_heard_ms) == (200, 1, 1)


def test_acks_of_another_session_or_unknown_peers() -> None:
    m = _master(max_phy_offset=1000)
    m.on_hello(P1, _hello(session=3), now_ms=0)
    assert m.on_ack(P1, Ack(2, 100), now_ms=0) == []
    error = _sent(m.on_ack(P2, Ack(9, 100), now_ms=0))[0]
    assert isinstance(error, Error) and error.session == 9 and "HELLO" in error.reason


def test_log_advance_streams_to_every_peer_and_never_goes_back() -> None:
    m = _master(max_phy_offset=0)
    m.on_hello(P1, _hello(broker_id=1), now_ms=0)
    m.on_hello(P2, _hello(broker_id=2), now_ms=0)
    reads = _of(m.on_log_advanced(150), mc.ReadAndSend)
    assert [(r.peer_id, r.phy_offset, r.length) for r in reads] == [
        (P1, 0, 100), (P1, 100, 50), (P2, 0, 100), (P2, 100, 50)]
    with pytest.raises(ValueError, match="went back"):
        m.on_log_advanced(149)


def test_heartbeat_only_when_idle_and_drop_after_housekeeping() -> None:
    m = _master(max_phy_offset=100)
    m.on_hello(P1, _hello(), now_ms=0)
    assert m.next_deadline_ms() == HB_MS
    assert m.tick(HB_MS - 1) == []
    assert _sent(m.tick(HB_MS)) == [Heartbeat(1, 1, 100, 100)]
    assert m.tick(HB_MS + 1) == []
    m.on_ack(P1, Ack(1, 100), now_ms=1500)
    assert m.tick(1500 + HK_MS) != [] and m.slaves()  # a heartbeat, still within the limit
    assert m.tick(1500 + HK_MS + 1) == [mc.Drop(P1, f"silent for {HK_MS + 1} ms")]
    assert m.next_deadline_ms() is None


def test_in_sync_and_quorum() -> None:
    m = _master(max_phy_offset=1000, haWindowBytes=2000, haMaxGapNotInSync=500)
    m.on_hello(P1, _hello(broker_id=1), now_ms=0)
    m.on_hello(P2, _hello(broker_id=2), now_ms=0)
    m.on_ack(P1, Ack(1, 900), now_ms=1)
    m.on_ack(P2, Ack(1, 400), now_ms=1)
    assert m.in_sync_count() == 1  # P2 lags 600 > 500
    assert m.acked_offset_quorum(0) == 1000
    assert m.acked_offset_quorum(1) == 900
    assert m.acked_offset_quorum(2) == NO_OFFSET
    m.on_ack(P2, Ack(1, 700), now_ms=2)
    assert m.in_sync_count() == 2 and m.acked_offset_quorum(2) == 700
    m.tick(2 + HK_MS + 1)  # both silent beyond housekeeping -> dropped
    assert m.in_sync_count() == 0


def test_snapshot_as_status() -> None:
    m = _master(max_phy_offset=1000)
    m.on_hello(P1, _hello(), now_ms=0)
    m.on_ack(P1, Ack(1, 250), now_ms=1)
    assert m.slaves()[0].as_status() == {"address": "10.0.0.1:10911", "ackOffset": 250,
                                         "lagBytes": 750, "inSync": True}


def test_trimming_below_a_peers_next_offset_tells_it() -> None:  # RocketMQ #3388
    m = _master(max_phy_offset=5000, haWindowBytes=100)
    m.on_hello(P1, _hello(broker_id=1), now_ms=0)
    m.on_hello(P2, _hello(broker_id=2, max_phy_offset=4500, history=(E(1, 0),)), now_ms=0)
    actions = m.on_log_trimmed(4096)
    error = _sent(actions)[0]
    assert isinstance(error, Error) and error.code is ResponseCode.OFFSET_OUT_OF_RANGE
    assert error.phy_offset == 4096
    assert _of(actions, mc.Drop)[0].peer_id == P1
    assert [s.peer_id for s in m.slaves()] == [P2]


def test_frames_a_slave_may_not_send_and_malformed_frames() -> None:
    m = _master(max_phy_offset=100)
    m.on_hello(P1, _hello(), now_ms=0)
    actions = m.on_frame(P1, Heartbeat(1, 1, 1, 1), now_ms=1)
    assert isinstance(_sent(actions)[0], Error) and _of(actions, mc.Drop)
    actions = m.on_bad_frame(P2, "undecodable header")
    assert "malformed" in _sent(actions)[0].reason  # type: ignore[union-attr]
    assert m.disconnect(P2, "gone") == []


def test_constructor_checks_history_against_the_log() -> None:
    with pytest.raises(ValueError, match="cover"):
        mc.MasterCore(_cfg(), (), 0, 0, now_ms=0)
    with pytest.raises(ValueError, match="cover"):
        mc.MasterCore(_cfg(), (E(1, 10),), 0, 100, now_ms=0)
    with pytest.raises(ValueError, match="beyond max"):
        mc.MasterCore(_cfg(), (E(1, 0), E(2, 200)), 0, 100, now_ms=0)


# ---- SlaveCore -------------------------------------------------------------------------------
def _slave(max_phy_offset: int = 0, history: tuple[E, ...] = (), session: int = 10,
           **overrides: object) -> sc.SlaveCore:
    cfg = _cfg(brokerId=1, brokerRole="SLAVE", **overrides)
    return sc.SlaveCore(cfg, max_phy_offset, history, first_session=session, now_ms=0)


def _transfer(s: sc.SlaveCore, epoch: int = 1, history: tuple[E, ...] = (E(1, 0),),
              master_max: int = 10_000) -> None:
    s.start(0)
    s.on_frame(HelloReply(s.session, epoch, 0, master_max, s.max_phy_offset, history), 0)
    assert s.state is sc.SlaveState.TRANSFER


def test_slave_starts_with_hello() -> None:
    s = _slave(max_phy_offset=300, history=(E(1, 0), E(2, 200)))
    assert _sent(s.start(0)) == [
        Hello(10, "b", 1, 300, "127.0.0.1:10911", (E(1, 0), E(2, 200)))]
    assert s.state is sc.SlaveState.HANDSHAKE


def test_history_beyond_the_recovered_log_is_trimmed_and_saved() -> None:
    s = _slave(max_phy_offset=150, history=(E(1, 0), E(2, 200)))
    actions = s.start(0)
    assert actions[0] == sc.SaveEpochs((E(1, 0),))
    assert _sent(actions)[0].epochs == (E(1, 0),)  # type: ignore[union-attr]


def test_reply_at_our_max_starts_transfer_with_an_ack() -> None:
    s = _slave(max_phy_offset=300, history=(E(1, 0),))
    s.start(0)
    actions = s.on_frame(HelloReply(10, 1, 0, 900, 300, (E(1, 0),)), 5)
    assert _sent(actions) == [Ack(10, 300, 1)]
    assert s.state is sc.SlaveState.TRANSFER


def test_reply_below_our_max_truncates_before_anything_else() -> None:
    s = _slave(max_phy_offset=900, history=(E(1, 0), E(2, 700)))
    s.start(0)
    actions = s.on_frame(HelloReply(10, 3, 0, 2000, 600, (E(1, 0), E(3, 600))), 5)
    assert actions[:2] == [sc.Truncate(600), sc.SaveEpochs((E(1, 0),))]
    assert _sent(actions) == [Ack(10, 600, 3)]
    assert s.max_phy_offset == 600


def test_empty_slave_resets_to_the_masters_min_and_adopts_its_epochs() -> None:
    s = _slave()
    s.start(0)
    actions = s.on_frame(HelloReply(10, 3, 4096, 9000, 4096, (E(1, 0), E(3, 5000))), 5)
    assert actions[:2] == [sc.ResetLog(4096), sc.SaveEpochs((E(1, 0),))]
    assert s.max_phy_offset == 4096
    assert _sent(s.resync("test", 6))[0].epochs == (E(1, 0),)  # type: ignore[union-attr]


def test_stale_replies_and_stale_master_epochs() -> None:
    s = _slave(max_phy_offset=100, history=(E(2, 0),))
    s.start(0)
    assert s.on_frame(HelloReply(9, 2, 0, 900, 0, (E(2, 0),)), 1) == []  # older session
    actions = s.on_frame(HelloReply(10, 1, 0, 900, 100, (E(1, 0),)), 1)
    assert actions == [sc.Failed(ResponseCode.STALE_EPOCH, 1,
                                 "master epoch 1 is older than ours 2")]
    assert s.state is sc.SlaveState.FAILED


def test_data_at_our_max_is_appended_then_acked() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    raw = memoryview(b"x" * 50)
    actions = s.on_frame(Data(10, 1, 0, 100, raw), 1)
    assert actions[0] == sc.Append(100, raw) and actions[0].data is raw
    assert _sent(actions) == [Ack(10, 150, 1)]
    assert s.max_phy_offset == 150


@pytest.mark.parametrize("phy_offset", [90, 120])  # overlap, gap
def test_data_off_our_max_is_never_appended_we_ask_again(phy_offset: int) -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    actions = s.on_frame(Data(10, 1, 0, phy_offset, b"y" * 20), 1)
    assert not _of(actions, sc.Append)
    assert _sent(actions) == [Hello(11, "b", 1, 100, "127.0.0.1:10911", (E(1, 0),))]
    assert s.state is sc.SlaveState.HANDSHAKE
    assert s.on_frame(Data(10, 1, 0, 100, b"z"), 2) == []  # the old session is over


def test_duplicate_data_is_ignored() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    assert s.on_frame(Data(10, 1, 0, 60, b"d" * 40), 1) == []
    assert s.state is sc.SlaveState.TRANSFER and s.stats().ignored_frames == 1


def test_partial_trailing_record_is_appended_as_bytes() -> None:  # RocketMQ #9002
    rec = bytes(record.encode(b"TopicA", b"body" * 20, b"", queue_id=0))
    s = _slave()
    _transfer(s)
    first = s.on_frame(Data(10, 1, 0, 0, rec[:37]), 1)
    second = s.on_frame(Data(10, 1, 0, 37, rec[37:]), 2)
    appended = [a.data for a in _of(first + second, sc.Append)]
    assert b"".join(appended) == rec and s.max_phy_offset == len(rec)


def test_new_epoch_at_its_boundary_is_saved_before_the_bytes() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s, epoch=1, history=(E(1, 0),))
    actions = s.on_frame(Data(10, 3, 100, 100, b"n" * 10), 1)
    assert actions[:2] == [sc.SaveEpochs((E(1, 0), E(3, 100))), sc.Append(100, b"n" * 10)]
    assert s.history == (E(1, 0), E(3, 100))


def test_masters_term_starting_at_our_max_is_adopted_at_the_handshake() -> None:
    """Drill finding: a slave promoted before the first DATA of its master's term must not
    number its own term like that one (same epoch, same start offset)."""
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    s.start(0)
    actions = s.on_frame(HelloReply(10, 3, 0, 100, 100, (E(1, 0), E(3, 100))), 1)
    assert sc.SaveEpochs((E(1, 0), E(3, 100))) in actions
    assert s.history == (E(1, 0), E(3, 100))
    actions = s.on_frame(Data(10, 3, 100, 100, b"n" * 10), 2)
    assert actions[0] == sc.Append(100, b"n" * 10)  # nothing new to save


def test_epoch_newer_than_the_master_said_is_accepted_only_at_a_boundary() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    assert _of(s.on_frame(Data(10, 4, 90, 100, b"q"), 1), sc.Append) == []
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    assert _of(s.on_frame(Data(10, 4, 100, 100, b"q"), 1), sc.Append) == [sc.Append(100, b"q")]
    assert s.stats().master_epoch == 4


@pytest.mark.parametrize(
    "data",
    [
        Data(10, 1, 0, 100, b"o"),  # epoch older than ours (2)
        Data(10, 2, 10, 100, b"o"),  # our epoch, another start
        Data(10, 3, 100, 100, b"o"),  # unknown to the master's history (it has 2 and 5)
        Data(10, 5, 60, 100, b"o"),  # newer epoch whose start is not this frame's offset
    ],
)
def test_epoch_problems_are_refused(data: Data) -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0), E(2, 50)))
    _transfer(s, epoch=5, history=(E(1, 0), E(2, 50), E(5, 60)))
    actions = s.on_frame(data, 1)
    assert not _of(actions, sc.Append) and s.state is sc.SlaveState.HANDSHAKE


def test_heartbeat_reporting_lost_frames_triggers_a_resync() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    assert s.on_frame(Heartbeat(10, 1, 500, 100), 1) == []
    assert s.stats().master_max_phy_offset == 500
    actions = s.on_frame(Heartbeat(10, 1, 500, 300), 2)
    assert isinstance(_sent(actions)[0], Hello) and s.stats().resyncs == 1


def test_slave_tick_acks_reconnects_and_retries_handshakes() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    assert s.next_deadline_ms() == HB_MS
    assert s.tick(HB_MS - 1) == []
    assert _sent(s.tick(HB_MS)) == [Ack(10, 100, 1)]
    s.on_frame(Heartbeat(10, 1, 100, 100), 3000)
    assert not _of(s.tick(3000 + HK_MS - 1), sc.Reconnect)
    actions = s.tick(3000 + HK_MS)
    assert isinstance(actions[0], sc.Reconnect) and isinstance(_sent(actions)[0], Hello)
    assert s.session == 11
    # no reply: a fresh HELLO every heartbeat interval
    assert _sent(s.tick(3000 + HK_MS + HB_MS))[0].session == 12  # type: ignore[union-attr]


def test_master_silence_is_measured_from_the_last_frame() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    s.on_frame(Heartbeat(10, 1, 100, 100), 4000)
    for now in range(HB_MS, 4000 + HK_MS, HB_MS):
        assert not _of(s.tick(now), sc.Reconnect)
    assert _of(s.tick(4000 + HK_MS), sc.Reconnect)


def test_out_of_range_error_fails_and_retries_only_after_housekeeping() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    s.start(0)
    actions = s.on_frame(Error(10, ResponseCode.OFFSET_OUT_OF_RANGE, 4096, "wipe"), 7)
    assert actions == [sc.Failed(ResponseCode.OFFSET_OUT_OF_RANGE, 4096, "wipe")]
    assert s.next_deadline_ms() == 7 + HK_MS
    assert s.tick(7 + HK_MS - 1) == []
    actions = s.tick(7 + HK_MS)
    assert isinstance(actions[0], sc.Reconnect) and isinstance(_sent(actions)[0], Hello)


def test_soft_error_in_transfer_resyncs_at_once_and_other_sessions_are_ignored() -> None:
    s = _slave(max_phy_offset=100, history=(E(1, 0),))
    _transfer(s)
    assert s.on_frame(Error(3, ResponseCode.BAD_REQUEST, NO_OFFSET, "old"), 1) == []
    actions = s.on_frame(Error(10, ResponseCode.BAD_REQUEST, NO_OFFSET, "HELLO first"), 1)
    assert isinstance(_sent(actions)[0], Hello) and s.state is sc.SlaveState.HANDSHAKE


def test_slave_refuses_frames_only_a_slave_sends() -> None:
    s = _slave()
    s.start(0)
    actions = s.on_frame(Ack(10, 0), 1)
    assert isinstance(actions[0], sc.Reconnect) and s.session == 11


# ---- master and slave together ---------------------------------------------------------------
class _Pair:
    """A master log, a slave log, and the two cores wired back to back without loss."""

    def __init__(self, master_log: bytes, history: tuple[E, ...], slave_log: bytes,
                 slave_history: tuple[E, ...], min_phy_offset: int = 0):
        self.master_log = bytearray(master_log)
        self.slave_log = bytearray(slave_log)
        self.slave_base = 0
        self.master = mc.MasterCore(_cfg(haWindowBytes=250), history, min_phy_offset,
                                    len(master_log), now_ms=0)
        self.slave = sc.SlaveCore(_cfg(brokerId=1), len(slave_log), slave_history, 1, now_ms=0)
        self.events: list[object] = []
        self.to_master: list[Frame] = []
        self.to_slave: list[Frame] = []

    def run(self, actions: list[sc.SlaveAction]) -> None:
        self._slave_do(actions)
        while self.to_master or self.to_slave:
            while self.to_master:
                self._master_do(self.master.on_frame(P1, self.to_master.pop(0), 0))
            while self.to_slave:
                self._slave_do(self.slave.on_frame(self.to_slave.pop(0), 0))

    def _master_do(self, actions: list[mc.MasterAction]) -> None:
        for a in actions:
            if isinstance(a, mc.ReadAndSend):
                self.to_slave.append(_frame(a.frames(
                    bytes(self.master_log[a.phy_offset:a.phy_offset + a.length]))))
            elif isinstance(a, mc.Send):
                self.to_slave.append(_frame(a.frames))
            self.events.append(a)

    def _slave_do(self, actions: list[sc.SlaveAction]) -> None:
        for a in actions:
            if isinstance(a, sc.SendToMaster):
                self.to_master.append(_frame(a.frames))
            elif isinstance(a, sc.Append):
                assert a.phy_offset == self.slave_base + len(self.slave_log)
                self.slave_log += a.data
            elif isinstance(a, sc.Truncate):
                del self.slave_log[a.phy_offset - self.slave_base:]
            elif isinstance(a, sc.ResetLog):
                self.slave_base = a.phy_offset
            self.events.append(a)


def test_old_master_rejoins_truncates_its_divergent_tail_and_catches_up() -> None:
    common = bytes(range(256)) * 3
    new_master = common + b"N" * 900
    pair = _Pair(new_master, (E(1, 0), E(2, len(common))), common + b"OLD" * 100, (E(1, 0),))
    pair.run(pair.slave.start(0))
    assert sc.Truncate(len(common)) in pair.events
    assert pair.slave_log == new_master
    assert pair.slave.history == (E(1, 0), E(2, len(common)))
    assert pair.master.slaves()[0].ack_offset == len(new_master)


def test_new_slave_joins_a_master_whose_first_segments_are_gone() -> None:
    log = bytes(5000)
    pair = _Pair(log, (E(1, 0),), b"", (), min_phy_offset=4096)
    pair.run(pair.slave.start(0))
    assert pair.slave_base == 4096 and bytes(pair.slave_log) == log[4096:]


def test_lagging_slave_below_the_masters_min_fails_loudly_not_silently() -> None:
    pair = _Pair(bytes(5000), (E(1, 0),), bytes(1000), (E(1, 0),), min_phy_offset=4096)
    pair.run(pair.slave.start(0))
    failed = _of(pair.events, sc.Failed)
    assert failed and failed[0].code is ResponseCode.OFFSET_OUT_OF_RANGE
    assert not _of(pair.events, mc.ReadAndSend) and pair.slave.state is sc.SlaveState.FAILED


# ---- GroupTransferCore -----------------------------------------------------------------------
def test_needed_acks_counts_the_master() -> None:
    assert needed_acks(_cfg(inSyncReplicas=2)) == 1
    assert needed_acks(_cfg(inSyncReplicas=1)) == 0
    gt = GroupTransferCore.from_config(_cfg(slaveTimeout=1234))
    assert gt.admit("t", 10, 0, 1, 1) is Admission.WAIT
    assert gt.tick(1233) == [] and gt.tick(1234) == ["t"]


def test_admission_outcomes() -> None:
    gt = GroupTransferCore(timeout_ms=100, max_waiters=2)
    assert gt.admit("a", 10, 0, in_sync_slaves=0, needed=0) is Admission.SEND_OK
    assert gt.admit("b", 10, 0, in_sync_slaves=0, needed=1) is Admission.SLAVE_NOT_AVAILABLE
    assert gt.admit("c", 10, 0, in_sync_slaves=1, needed=1) is Admission.WAIT
    assert gt.admit("d", 20, 0, in_sync_slaves=2, needed=2) is Admission.WAIT
    assert gt.admit("e", 30, 0, in_sync_slaves=2, needed=1) is Admission.SYSTEM_BUSY
    with pytest.raises(ValueError, match="already waiting"):
        gt.admit("c", 40, 0, 1, 1)
    assert gt.pending == 2


def test_acks_complete_waiters_in_offset_order_and_never_early() -> None:
    gt = GroupTransferCore(timeout_ms=100, max_waiters=10)
    for token, end in [("x", 300), ("y", 100), ("z", 200), ("w", 200)]:
        gt.admit(token, end, 0, 1, 1)
    assert gt.on_acks(99) == []
    assert gt.on_acks(200) == ["y", "z", "w"]
    assert gt.on_acks(150) == []  # a lower quorum never takes back the high-water mark
    assert gt.acked_offset == 200
    assert gt.admit("v", 180, 0, 0, 1) is Admission.SEND_OK  # already covered
    assert gt.on_acks(300) == ["x"] and gt.pending == 0


def test_timeouts_come_exactly_at_the_deadline_in_order() -> None:
    gt = GroupTransferCore(timeout_ms=1000, max_waiters=10)
    gt.admit("a", 10, 5, 1, 1)
    gt.admit("b", 20, 3, 1, 1)
    gt.admit("c", 30, 7, 1, 1)
    assert gt.next_deadline_ms() == 1003
    assert gt.tick(1002) == []
    assert gt.tick(1005) == ["b", "a"]
    gt.on_acks(30)  # c completes, so it never times out
    assert gt.next_deadline_ms() is None and gt.tick(10_000) == []


def test_cancel_all_returns_waiting_tokens_in_offset_order() -> None:
    gt = GroupTransferCore(timeout_ms=1000, max_waiters=10)
    gt.admit("late", 50, 0, 1, 1)
    gt.admit("early", 10, 0, 1, 1)
    assert gt.cancel_all() == ["early", "late"] and gt.pending == 0


def test_completed_waiters_do_not_pile_up() -> None:
    gt = GroupTransferCore(timeout_ms=10**9, max_waiters=10)
    for i in range(10_000):
        assert gt.admit(i, i + 1, i, 1, 1) is Admission.WAIT
        assert gt.on_acks(i + 1) == [i]
    assert len(gt._by_deadline) <= 2 * gt.pending + 65
    assert len(gt._by_offset) <= 2 * gt.pending + 65


# ---- controller mode: epochs in acks, SyncStateSet acks ---------------------------------------
def test_an_ack_from_a_newer_epoch_fences_the_master_and_counts_nothing() -> None:
    m = _master(max_phy_offset=300)
    m.on_hello(P1, _hello(), now_ms=0)
    assert _of(m.on_ack(P1, Ack(1, 100, 1), now_ms=1), mc.AcksAdvanced)  # its own epoch: fine
    actions = m.on_ack(P1, Ack(1, 200, 513), now_ms=2)
    assert _of(actions, mc.Fenced) == [mc.Fenced(P1, 513, actions[1].reason)]  # type: ignore[union-attr]
    assert _sent(actions)[0].code == ResponseCode.STALE_EPOCH  # type: ignore[union-attr]
    assert not _of(actions, mc.AcksAdvanced) and m.peer_count == 0
    assert m.acked_offset_quorum(1) == NO_OFFSET


def test_acks_of_a_set_need_every_member_connected() -> None:
    m = _master(max_phy_offset=300)
    assert m.acked_offset_all(frozenset()) == 300
    m.on_hello(P1, _hello(broker_id=2), now_ms=0)
    m.on_hello(P2, _hello(broker_id=3), now_ms=0)
    m.on_ack(P1, Ack(1, 250), now_ms=1)
    m.on_ack(P2, Ack(1, 120), now_ms=1)
    assert m.acked_offset_all(frozenset({2})) == 250
    assert m.acked_offset_all(frozenset({2, 3})) == 120  # the slowest member holds it
    assert m.acked_offset_all(frozenset({2, 3, 4})) == NO_OFFSET  # 4 is not connected
    assert m.progress() == {2: 250, 3: 120}


def test_a_slave_acks_with_its_epoch_and_refuses_a_replaced_master() -> None:
    s = _slave(max_phy_offset=100, history=(E(257, 0),))
    _transfer(s, epoch=257, history=(E(257, 0),))
    assert _sent(s.tick(HB_MS)) == [Ack(10, 100, 257)]
    s.require_epoch(514)  # the controller named a master of epoch 514
    assert _sent(s.tick(2 * HB_MS)) == [Ack(10, 100, 514)]  # the old master learns it
    actions = s.on_frame(Data(10, 257, 0, 100, b"x" * 10), 2 * HB_MS + 1)
    assert _of(actions, sc.Failed)[0].code == ResponseCode.STALE_EPOCH  # type: ignore[union-attr]
    assert not _of(actions, sc.Append) and s.max_phy_offset == 100
    # a current master (epoch 514) streams the log's history: DATA of epoch 257 is fine
    s3 = _slave(max_phy_offset=100, history=(E(257, 0),))
    s3.require_epoch(514)
    s3.start(0)
    s3.on_frame(HelloReply(10, 514, 0, 900, 100, (E(257, 0), E(514, 800))), 1)
    actions = s3.on_frame(Data(10, 257, 0, 100, b"y" * 10), 2)
    assert _of(actions, sc.Append) and not _of(actions, sc.Failed)
    s2 = _slave(max_phy_offset=100, history=(E(257, 0),))
    s2.require_epoch(514)
    s2.start(0)
    actions = s2.on_frame(HelloReply(10, 257, 0, 900, 100, (E(257, 0),)), 1)
    assert _of(actions, sc.Failed)[0].code == ResponseCode.STALE_EPOCH  # type: ignore[union-attr]
