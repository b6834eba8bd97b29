"""Seeded simulation of the SyncStateSet keeper (``common/ha/controller_core.py``): a master's
log grows, slaves ack, pause, fall behind, disconnect and come back, the controller commits a
proposal after a random delay (or refuses it), and the keeper runs its checks, two-step joins
included, as the master's HA service drives it.

What must hold at every step, for every seed:
* **nothing acknowledged is missing from a committed member**: when an addition commits, the
  new member's ack is at least every offset acknowledged so far (a put is acknowledged once
  every member of the committed set, and of a join's pending one, holds it);
* a proposal names a member only once its ack reached the join's mark, and the mark is at
  least everything acknowledged before the join began;
* **liveness**: a slave that stays connected and caught up is in the committed set within a
  bounded number of checks.

``REPLOG_SIM_SEED=<n>`` replays one seed; ``REPLOG_SIM_SEEDS=<count>`` changes how many run.
"""

from __future__ import annotations

import os
import random

import pytest

from common.ha import controller_core as cc

DEFAULT_SEEDS = 300
BASE_SEED = 70_000
CHECK_MS = 250
ME = 1


def _seeds() -> list[int]:
    if "REPLOG_SIM_SEED" in os.environ:
        return [int(os.environ["REPLOG_SIM_SEED"])]
    count = int(os.environ.get("REPLOG_SIM_SEEDS", DEFAULT_SEEDS))
    return list(range(BASE_SEED, BASE_SEED + count))


class Failure(AssertionError):
    pass


def run_seed(seed: int) -> dict[str, int]:
    rnd = random.Random(seed)
    slaves = list(range(2, 2 + rnd.randint(1, 3)))
    keeper = cc.SyncStateSetKeeper(ME, max_not_caught_up_ms=rnd.choice([500, 1000, 2000]),
                                   join_timeout_ms=rnd.choice([750, 1500, 3000]))
    committed = frozenset({ME})
    acks = {m: 0 for m in slaves}
    connected = {m: True for m in slaves}
    paused = {m: 0 for m in slaves}  # checks left without progress
    master_max = 0
    acknowledged = 0  # the highest offset a client was told SEND_OK for
    proposal: tuple[cc.SetChange, int] | None = None  # in flight: due at this check
    marks: dict[int, int] = {}  # a joining member -> its mark
    joins = adds = removals = 0
    steady_since: dict[int, int] = {}  # a member connected and keeping up since this check

    def fail(what: str) -> None:
        raise Failure(f"seed {seed}: {what} (replay: REPLOG_SIM_SEED={seed})")

    for check in range(400):
        now = check * CHECK_MS
        # the log grows; slaves ack (some pause, some drop and come back)
        previous_max = master_max
        master_max += rnd.randint(0, 5000)
        for m in slaves:
            if connected[m] and rnd.random() < 0.02:
                connected[m] = False
            elif not connected[m] and rnd.random() < 0.1:
                connected[m] = True
                acks[m] = min(acks[m], master_max)  # it resumes where it was
            if paused[m] == 0 and rnd.random() < 0.03:
                paused[m] = rnd.randint(1, 20)
            if connected[m] and paused[m] == 0:  # a round trip behind at most
                acks[m] = max(acks[m], rnd.randint(previous_max, master_max))
            paused[m] = max(0, paused[m] - 1)
            keeping_up = connected[m] and paused[m] == 0
            if not keeping_up:
                steady_since.pop(m, None)
            else:
                steady_since.setdefault(m, check)
        # puts acknowledged now: what every required member holds
        required = (committed | (keeper.pending() or frozenset())) - {ME}
        if all(connected[m] for m in required):
            quorum = min((acks[m] for m in required), default=master_max)
            acknowledged = max(acknowledged, min(quorum, master_max))
        # the controller answers a proposal after a while
        if proposal is not None and check >= proposal[1]:
            change, _ = proposal
            proposal = None
            if rnd.random() < 0.9:
                for m in change.added:
                    if acks[m] < acknowledged and connected[m]:
                        fail(f"member {m} committed holding {acks[m]}, "
                             f"{acknowledged} was acknowledged")
                    adds += 1
                removals += len(change.removed)
                committed = change.members
            keeper.settled()
        if proposal is not None:
            continue  # the HA service checks nothing while a proposal is out
        progress = [cc.SlaveProgress(m, acks[m]) for m in slaves if connected[m]]
        step = keeper.check(committed, progress, master_max, 0, now,
                            mark_of=lambda end=master_max: end)
        if step.joined:
            join = keeper.joining
            assert join is not None
            if join.mark < acknowledged:
                fail(f"join of {join.member} marked {join.mark} < {acknowledged} acknowledged")
            marks[join.member] = join.mark
            joins += 1
        if step.propose is not None:
            for m in step.propose.added:
                if acks[m] < marks.get(m, 1 << 62):
                    fail(f"member {m} proposed at {acks[m]}, before its mark {marks.get(m)}")
            proposal = (step.propose, check + rnd.randint(1, 4))
        for m, since in steady_since.items():
            if check - since > 40 and m not in committed and proposal is None \
                    and keeper.joining is None:
                fail(f"member {m} kept up for {check - since} checks and is not in the set")
    return {"joins": joins, "adds": adds, "removals": removals}


@pytest.mark.sim
def test_the_keeper_never_commits_a_member_missing_an_acknowledged_put() -> None:
    totals = {"joins": 0, "adds": 0, "removals": 0}
    for seed in _seeds():
        for k, v in run_seed(seed).items():
            totals[k] += v
    # the seeds exercise what they are about: joins, additions and removals, many of each
    assert totals["adds"] > 100 and totals["removals"] > 100 and totals["joins"] >= totals["adds"]
