"""Seeded simulation of master + slaves + SYNC waits over a faulty fake network.

``REPLOG_SIM_SEED=<n>`` replays one seed; ``REPLOG_SIM_SEEDS=<count>`` changes how many run.
A failure message names the seed.
"""

from __future__ import annotations

import os
import time

import pytest
from ha_sim_cluster import SimFailure, Stats, run_seed

DEFAULT_SEEDS = 2000
BASE_SEED = 20_000


def _seeds() -> list[int]:
    if "REPLOG_SIM_SEED" in os.environ:
        return [int(os.environ["REPLOG_SIM_SEED"])]
    count = int(os.environ.get("REPLOG_SIM_SEEDS", DEFAULT_SEEDS))
    return list(range(BASE_SEED, BASE_SEED + count))


@pytest.mark.sim
def test_replication_invariants_hold_under_faults() -> None:
    seeds = _seeds()
    total = Stats()
    started = time.perf_counter()
    for seed in seeds:
        try:
            total.add(run_seed(seed))
        except SimFailure:
            raise
        except Exception as e:  # a crash inside a core is a failure of that seed too
            raise SimFailure(f"seed {seed} crashed: {type(e).__name__}: {e} "
                             f"(replay: REPLOG_SIM_SEED={seed})") from e
    elapsed = time.perf_counter() - started
    print(f"\n{len(seeds)} seeds in {elapsed:.1f} s ({len(seeds) / elapsed:.0f} seeds/s): {total}")
    if len(seeds) >= 200:  # the run as a whole must have exercised every path it checks
        assert total.send_ok > 0 and total.slave_timeouts > 0
        assert total.slave_not_available > 0 and total.truncations > 0 and total.resets > 0
        assert total.resyncs > 0 and total.master_drops > 0


@pytest.mark.sim
def test_same_seed_replays_identically() -> None:
    assert run_seed(BASE_SEED + 7) == run_seed(BASE_SEED + 7)
