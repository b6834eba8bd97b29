"""common/ha/controller_core.py: records, election, SyncStateSet upkeep, lease (pure)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.ha import controller_core as cc
from common.ha import epochs as ep
from common.ha.controller_core import GroupState, MemberRecord

pytestmark = pytest.mark.unit


def member(mid: int, epoch: int = 0, max_offset: int = 0, priority: int = cc.NO_PRIORITY,
           role: str = "SLAVE") -> MemberRecord:
    return MemberRecord(mid, f"127.0.0.1:{10000 + mid}", f"127.0.0.1:{20000 + mid}", role,
                        epoch, max_offset, max_offset, priority, "inc")


def state(master: int | None, epoch: int, sss: set[int], sss_epoch: int = 1) -> GroupState:
    addr = f"127.0.0.1:{10000 + master}" if master else ""
    ha = f"127.0.0.1:{20000 + master}" if master else ""
    return GroupState(master, epoch, addr, ha, frozenset(sss), sss_epoch)


# ---- records ---------------------------------------------------------------------------------
def test_records_round_trip() -> None:
    s = state(2, 513, {1, 2, 3}, 7)
    assert GroupState.from_bytes(s.to_bytes()) == s
    assert GroupState.from_bytes(s.without_master().to_bytes()).master is None
    m = member(3, 513, 4096, 5, "MASTER")
    assert MemberRecord.from_bytes(m.to_bytes()) == m
    sw = cc.Switchover(2, 1_700_000_000_000)
    assert cc.Switchover.from_bytes(sw.to_bytes()) == sw


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({"masterId": 0}, "masterId"),
        ({"masterId": True}, "masterId"),
        ({"masterId": 4}, "not in its SyncStateSet"),
        ({"syncStateSet": [1, 1]}, "listed twice"),
        ({"syncStateSet": "1,2"}, "syncStateSet"),
        ({"masterEpoch": -1}, "masterEpoch"),
        ({"masterAddress": "nohost"}, "host:port"),
        ({"masterAddress": "h:70000"}, "host:port"),
        ({"extra": 1}, "unknown"),
    ],
)
def test_a_malformed_state_is_refused_naming_the_field(doc: dict[str, object],
                                                        reason: str) -> None:
    base = json.loads(state(1, 257, {1, 2}).to_bytes())
    base.update(doc)
    with pytest.raises(cc.RecordError, match=reason):
        GroupState.from_bytes(json.dumps(base).encode())


@pytest.mark.parametrize("raw", [b"", b"null", b"[]", b"\xff\xfe", b"{" * 100_000,
                                 b"x" * (cc.MAX_RECORD_BYTES + 1)])
def test_garbage_is_a_record_error(raw: bytes) -> None:
    for parse in (GroupState.from_bytes, MemberRecord.from_bytes, cc.Switchover.from_bytes):
        with pytest.raises(cc.RecordError):
            parse(raw)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512) | st.dictionaries(
    st.sampled_from(["masterId", "masterEpoch", "masterAddress", "masterHaAddress",
                     "syncStateSet", "syncStateSetEpoch", "id", "role"]),
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20)
    | st.lists(st.integers(-5, 300), max_size=5)).map(lambda d: json.dumps(d).encode()))
def test_any_bytes_parse_or_raise_record_error(raw: bytes) -> None:
    for parse in (GroupState.from_bytes, MemberRecord.from_bytes, cc.Switchover.from_bytes):
        try:
            parse(raw)
        except cc.RecordError:
            pass


# ---- election --------------------------------------------------------------------------------
def test_a_live_master_means_no_election() -> None:
    live = {1: member(1), 2: member(2)}
    assert isinstance(cc.decide_election(state(1, 257, {1, 2}), live, 2, False), cc.MasterAlive)


def test_the_best_live_member_of_the_set_wins_with_a_new_epoch() -> None:
    s = state(1, 257, {1, 2, 3}, 4)
    live = {2: member(2, 257, 900), 3: member(3, 257, 1000), 4: member(4, 257, 5000)}
    assert cc.decide_election(s, live, 2, False) == cc.Defer(3)
    assert cc.decide_election(s, live, 4, False) == cc.Defer(3)  # not in the set
    decision = cc.decide_election(s, live, 3, False)
    assert isinstance(decision, cc.Elect) and not decision.unclean
    new = decision.state
    # the live members of the old set stay in it (2); the dead one (1) does not
    assert new.master == 3 and new.sync_state_set == {2, 3} and new.sync_state_set_epoch == 5
    assert new.master_epoch == ep.next_epoch(257, 3) and new.master_epoch & 0xFF == 3
    assert new.master_address == live[3].address and new.master_ha_address == live[3].ha_address


def test_ranking_is_epoch_then_offset_then_priority_then_id() -> None:
    s = state(9, 513, {1, 2, 3, 4, 9})
    newer_epoch = {1: member(1, 513, 10), 2: member(2, 257, 10_000)}
    assert cc.decide_election(s, newer_epoch, 2, False) == cc.Defer(1)
    by_priority = {1: member(1, 513, 10, priority=7), 2: member(2, 513, 10, priority=3)}
    assert cc.decide_election(s, by_priority, 1, False) == cc.Defer(2)
    by_id = {3: member(3, 513, 10), 4: member(4, 513, 10)}
    assert cc.decide_election(s, by_id, 4, False) == cc.Defer(3)


def test_no_eligible_member_means_no_master_unless_unclean() -> None:
    s = state(1, 257, {1, 2})
    live = {3: member(3, 257, 400), 4: member(4, 257, 300)}
    decision = cc.decide_election(s, live, 3, False, known_max_offset=1000)
    assert isinstance(decision, cc.NoMaster)
    assert "[1, 2]" in decision.reason and "enableElectUncleanMaster" in decision.reason
    unclean = cc.decide_election(s, live, 3, True, known_max_offset=1000)
    assert isinstance(unclean, cc.Elect) and unclean.unclean
    assert unclean.state.sync_state_set == {3}
    assert (unclean.lost_from, unclean.lost_to) == (400, 1000)
    assert cc.decide_election(s, live, 4, True, known_max_offset=1000) == cc.Defer(3)


def test_the_first_election_takes_any_live_member_and_never_reuses_an_epoch() -> None:
    live = {1: member(1, 0, 0), 2: member(2, 770, 0)}  # 2 saw epoch 770 in an earlier life
    decision = cc.decide_election(None, live, 2, False)
    assert isinstance(decision, cc.Elect)
    assert decision.state.master_epoch > 770 and decision.state.sync_state_set_epoch == 1
    assert cc.decide_election(None, live, 1, False) == cc.Defer(2)


def test_an_unregistered_member_cannot_elect_itself() -> None:
    assert isinstance(cc.decide_election(None, {1: member(1)}, 2, False), cc.NoMaster)


# ---- SyncStateSet upkeep ---------------------------------------------------------------------
def test_a_disconnected_member_leaves_at_once_after_the_terms_connect_grace() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=5000, connect_grace_ms=2000,
                              started_ms=1000)
    assert k.observe(frozenset({1, 2, 3}), [cc.SlaveProgress(2, 100)], 100, 100, 0, 2999) is None
    change = k.observe(frozenset({1, 2, 3}), [cc.SlaveProgress(2, 100)], 100, 100, 0, 3000)
    assert change is not None and change.members == {1, 2} and change.removed == {3}
    assert "member 3 is not connected" in change.reason


def test_a_member_behind_for_too_long_leaves_and_joins_again_once_caught_up() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=1000)
    sss = frozenset({1, 2})
    assert k.observe(sss, [cc.SlaveProgress(2, 100)], 100, 100, 0, 0) is None
    # the master moves on, the member stays at 100 (paused). At 250 it still holds what the
    # master had one check before (caught up then); from there it has 1000 ms
    assert k.observe(sss, [cc.SlaveProgress(2, 100)], 500, 100, 0, 250) is None
    assert k.observe(sss, [cc.SlaveProgress(2, 100)], 900, 100, 0, 1250) is None
    change = k.observe(sss, [cc.SlaveProgress(2, 100)], 900, 100, 0, 1251)
    assert change is not None and change.removed == {2} and "not caught up" in change.reason
    out = frozenset({1})
    # it catches up to what was acknowledged: it joins again
    assert k.observe(out, [cc.SlaveProgress(2, 800)], 900, 900, 0, 1300) is None
    change = k.observe(out, [cc.SlaveProgress(2, 900)], 950, 900, 0, 1400)
    assert change is not None and change.added == {2} and change.members == {1, 2}


def test_a_steadily_loaded_member_one_round_trip_behind_stays() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=1000)
    sss = frozenset({1, 2})
    master = 0
    for now in range(0, 10_000, 250):
        ack = master  # the member holds what the master had at the previous check
        master += 1000
        assert k.observe(sss, [cc.SlaveProgress(2, ack)], master, ack, 0, now) is None


def test_a_member_of_an_older_term_does_not_join_before_the_epoch_start() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=1000)
    assert k.observe(frozenset({1}), [cc.SlaveProgress(2, 400)], 600, 300, 500, 0) is None


# ---- lease -----------------------------------------------------------------------------------
def test_the_lease_counts_from_the_start_of_the_last_confirmed_write() -> None:
    lease = cc.Lease(1500)
    assert not lease.fresh(100.0) and lease.age_s(100.0) is None
    lease.confirm(100.0, lease.generation)
    assert lease.fresh(101.49) and not lease.fresh(101.5)
    lease.confirm(99.0, lease.generation)  # an older write finishing late does not pull it back
    assert lease.fresh(101.49)
    lease.expire()
    assert not lease.fresh(100.1)
    with pytest.raises(ValueError):
        cc.Lease(0)


def test_a_write_sent_before_the_lease_expired_confirms_nothing_after() -> None:
    lease = cc.Lease(1500)
    sent_in = lease.generation
    lease.expire()  # a suspension, or mastership lost, while that write was in flight
    assert not lease.confirm(100.0, sent_in) and not lease.fresh(100.1)
    assert lease.confirm(100.0, lease.generation) and lease.fresh(100.1)


# ---- members that must not lead (issue 36, items 6 and 9) ------------------------------------
def test_a_member_that_failed_to_take_over_stands_no_more_and_the_others_elect() -> None:
    """It ranks best (the longest log), won, could not serve, resigned: the others deferred
    to it for ever. Its record's fault takes it out of the running."""
    broken = dataclasses.replace(member(1, 513, 9000), fault="failed to take over: corrupt")
    live = {1: broken, 2: member(2, 513, 8000), 3: member(3, 513, 7000)}
    s = state(None, 513, {1, 2, 3}).without_master()
    decision = cc.decide_election(s, live, 2, False)
    assert isinstance(decision, cc.Elect) and decision.state.master == 2
    assert 1 not in decision.state.sync_state_set  # it may join again once caught up
    assert isinstance(cc.decide_election(s, live, 3, False), cc.Defer)  # to 2, not to 1
    alone = cc.decide_election(s, {1: broken}, 1, False)
    assert isinstance(alone, cc.NoMaster) and "failed to take over" in alone.reason


def test_a_member_back_with_another_store_is_no_candidate() -> None:
    """A wiped or replaced disk: the member id is the same, the replica is not. Elected, it
    would have made the others truncate everything that was acknowledged."""
    s = dataclasses.replace(state(None, 513, {1, 2}), stores={1: "disk-a", 2: "disk-b"})
    wiped = dataclasses.replace(member(2, 0, 0), store_id="disk-new")
    decision = cc.decide_election(s, {2: wiped}, 2, False)
    assert isinstance(decision, cc.NoMaster) and "another store" in decision.reason
    same = dataclasses.replace(member(2, 513, 100), store_id="disk-b")
    won = cc.decide_election(s, {2: same}, 2, False)
    assert isinstance(won, cc.Elect) and won.state.stores == {2: "disk-b"}
    assert GroupState.from_bytes(won.state.to_bytes()) == won.state


def test_the_set_records_each_members_store_as_it_joins() -> None:
    s = dataclasses.replace(state(1, 513, {1}), stores={1: "disk-a"})
    joined = s.with_sync_state_set({1, 2}, {2: "disk-b"})
    assert joined.stores == {1: "disk-a", 2: "disk-b"}
    assert joined.with_sync_state_set({1}).stores == {1: "disk-a"}
    old_state = json.loads(state(1, 513, {1, 2}).to_bytes())  # written before store ids
    assert GroupState.from_bytes(json.dumps(old_state).encode()).stores == {}
    old_member = member(2).to_json()
    del old_member["storeId"], old_member["fault"]
    assert MemberRecord.from_bytes(json.dumps(old_member).encode()).store_id == ""


def test_a_member_first_seen_behind_the_confirmed_offset_leaves_at_once() -> None:
    """A reconnecting member counted as caught up on first sight: one whose disk was wiped
    stayed in the set (electable) for haMaxTimeSlaveNotCatchup while it held nothing."""
    keeper = cc.SyncStateSetKeeper(1, 15_000)
    change = keeper.observe(frozenset({1, 2, 3}),
                            [cc.SlaveProgress(2, 0), cc.SlaveProgress(3, 5000)],
                            5000, 4000, 0, now_ms=1000, confirmed=4000)
    assert change is not None and change.removed == {2} and change.members == {1, 3}
    assert "lost data" in change.reason


# ---- the two-step join (SyncStateSetKeeper.check) ---------------------------------------------
def test_a_slave_joins_in_two_steps_from_the_logs_end() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=5000, join_timeout_ms=1000)
    sss = frozenset({1})
    step = k.check(sss, [cc.SlaveProgress(2, 0)], 100, 0, 0, mark_of=lambda: 120)
    assert step.joined and step.propose is None
    assert k.pending() == {1, 2}  # puts wait for it from now
    assert k.joining is not None and k.joining.mark == 120  # the log's end as the store says
    assert k.check(sss, [cc.SlaveProgress(2, 119)], 900, 0, 250) == cc.KeeperStep()
    done = k.check(sss, [cc.SlaveProgress(2, 120)], 900, 0, 500)
    assert done.propose is not None and done.propose.added == {2} and done.propose.members == {1, 2}
    assert k.pending() == {1, 2}  # until the controller answers
    k.settled()
    assert k.pending() is None and k.joining is None


def test_a_join_is_called_off_when_the_slave_leaves_or_lags() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=5000, join_timeout_ms=1000)
    sss = frozenset({1})
    assert k.check(sss, [cc.SlaveProgress(2, 0)], 100, 0, 0).joined
    gone = k.check(sss, [], 100, 0, 250)
    assert "disconnected" in gone.cancelled and k.pending() is None
    assert k.check(sss, [cc.SlaveProgress(2, 100)], 200, 0, 250).joined  # holds the last end
    assert k.check(sss, [cc.SlaveProgress(2, 150)], 900, 0, 1250) == cc.KeeperStep()
    lagging = k.check(sss, [cc.SlaveProgress(2, 150)], 900, 0, 1251)
    assert "did not reach 200" in lagging.cancelled and k.pending() is None


def test_a_removal_is_proposed_at_once() -> None:
    k = cc.SyncStateSetKeeper(1, max_not_caught_up_ms=5000)
    step = k.check(frozenset({1, 2}), [], 100, 0, 0)
    assert step.propose is not None and step.propose.removed == {2} and not step.joined
    assert k.pending() is None
