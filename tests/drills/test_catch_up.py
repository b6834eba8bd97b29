"""Slave far behind catches up (docs/drills.md row 11): PR tier; its rate and p99 targets, perf tier.

An ASYNC_MASTER and its slave run a steady put workload through the client. The slave is
SIGSTOPped while ``DRILL_CATCHUP_MB`` (default 192; the nightly figure is 2048) more MiB are
written to the master, then resumed while the workload goes on. The drill reports the catch-up
rate (MB/s, from the slave's offset over time), the master's put latency before and during the
catch-up, and the growth of the master's anonymous memory (the log is streamed in chunks
straight from the mapping; file pages read through the mapping show in RssFile, which is
reported, not judged). It ends like every drill: drain, byte comparison, total-queue check.

Two runs. *flow-control*: ``haFlowControlEnable`` with ``maxHaTransferByteInSecond`` = 24 MiB/s,
the setting under which row 11's "master put p99 under 2x the baseline" holds on this 2-core
box, where the slave's catch-up competes with the master for the same CPUs. *uncapped*: the
catch-up at full speed (about 250 MB/s here); its put p99 (about 10x the baseline) is reported,
not judged. The p99 criterion compares with ``max(baseline p99, 1 ms)``: a synchronous Python
client's baseline is well under a millisecond here and one scheduler hiccup on this VM is
about that long. The baseline is the higher p99 of two quiet windows, one before the slave is
stopped and one after it caught up (as long as the catch-up took): this VM's own p99 drifts
by more than the catch-up adds (0.9 to 1.5 ms between runs here), and one window alone made
the verdict depend on which way it drifted. The load (2 x 250 puts/s) and the windows (8 s baseline, ~8 s capped catch-up)
give each p99 some 4 000 samples: with ~1 000, a few scheduler stalls of this shared VM decided
it (one CI run failed so, 4.6 ms against 2.1 ms).

The rate floor and the p99 factor are judged in the ``perf`` tier only (``make bench``,
tests/time_bounds.py): on a 2-vCPU VM shared with other work they measure the machine as much
as the code. The PR tier runs the same drill and judges the rest (memory, convergence, no
loss); it reports the figures.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from harness import Drill, Node, put_latencies_ms
from replication_harness import wait_for
from time_bounds import tier

from common.client import Producer

pytestmark = [pytest.mark.drill, pytest.mark.integration]

CATCHUP_MB = int(os.environ.get("DRILL_CATCHUP_MB", "192"))
SEGMENT = 32 * 1024 * 1024
PRODUCERS = 2
RATE = 250.0  # puts/s per producer: the load that goes on through the catch-up
BASELINE_S = 8.0
RATE_FLOOR_MB_S = 20.0  # docs/drills.md row 11's calibration floor
ANON_GROWTH_LIMIT = 64 * 1024 * 1024
P99_FACTOR = 2.0  # row 11: master put p99 during catch-up under 2x the baseline
FILL_BODY = 16 * 1024
CAP = 24 * 1024 * 1024  # maxHaTransferByteInSecond of the capped run


def _memory(pid: int) -> dict[str, int]:
    """RssAnon and RssFile of ``pid`` in bytes (/proc/<pid>/status)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else 0.0


def _fill(master: Node, total: int) -> None:
    """``total`` bytes more on the master's log, as fast as the broker takes them (bodies
    stored as they are: the drill counts log bytes, which compression would shrink)."""
    body = os.urandom(FILL_BODY)
    target = master.status()["maxPhyOffset"] + total
    with Producer([master.address], timeout_ms=30_000, retries=0,
                  compress_over_bytes=None) as p:
        while master.status()["maxPhyOffset"] < target:
            for _ in range(8):
                p.send_batch("fill", [body] * 64, queue_id=0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("capped", [True, False], ids=["flow-control", "uncapped"])
@pytest.mark.parametrize("judge_perf", tier(False, True))
def test_a_slave_far_behind_catches_up_under_load(tmp_path: Path, capped: bool,
                                                  judge_perf: bool) -> None:
    flow = {"haFlowControlEnable": True, "maxHaTransferByteInSecond": CAP} if capped else {}
    # Start from a written-back page cache: a fresh `make test` leaves ~900 MB of the venv
    # install dirty, and its writeback ~30 s later landed in the catch-up window (one CI run:
    # p99 2.6 ms against a 1.2 ms baseline).
    os.sync()
    with Drill("slave-catch-up" + ("-capped" if capped else ""), tmp_path) as drill:
        ha = {"mappedFileSizeCommitLog": SEGMENT, **flow}
        m = drill.node("m", slave_id=1, **ha)
        s = drill.node("s", slave_id=2, **ha)
        drill.start_group(m, "ASYNC_MASTER", s)
        servers = [m.address, s.address]
        drill.add_load(servers, PRODUCERS, RATE, consumer=False)
        threading.Event().wait(1.0)  # connections up: keep discovery out of the baseline
        t_base = drill.history.now()
        threading.Event().wait(BASELINE_S)
        baseline = put_latencies_ms(drill.history.events, t_base, drill.history.now())
        mem_before = _memory(m.pid)

        # Where the slave stands when it stops (at most a few puts short of it: the load goes
        # on). Asked of the slave itself: once the fill takes longer than
        # haHousekeepingInterval the master has rightly dropped the silent slave from its view.
        start_offset = int(s.status()["maxPhyOffset"])
        s.pause()
        _fill(m, CATCHUP_MB * 1024 * 1024)
        target = m.status()["maxPhyOffset"]
        # the fill's own flush is not the catch-up's doing: let the master write it out first
        wait_for(lambda: m.status()["flushedPhyOffset"] >= target, 60, "the master's flush")
        t_resume = drill.history.now()
        s.resume()

        samples: list[tuple[float, int]] = []
        peak = dict(mem_before)

        def caught_up() -> bool:
            offset = int(s.status()["maxPhyOffset"])
            samples.append((drill.history.now(), offset))
            for key, value in _memory(m.pid).items():
                peak[key] = max(peak[key], value)
            return offset >= target

        wait_for(caught_up, 240, f"the slave to reach {target}", step_s=0.1)
        t_done = drill.history.now()
        during = put_latencies_ms(drill.history.events, t_resume, t_done)
        after: list[float] = []
        if capped:  # a second quiet window, as long as the catch-up took
            threading.Event().wait(max(BASELINE_S / 2, t_done - t_resume))
            after = put_latencies_ms(drill.history.events, t_done, drill.history.now())
        reference = max(_p99(baseline), _p99(after))
        # from the first sample that moved: the time to reconnect is not transfer time
        moving = [(t, o) for t, o in samples if o > start_offset] or samples
        seconds = max(t_done - moving[0][0], 1e-3)
        rate = (target - moving[0][1]) / seconds / 1e6
        drill.extra.update(
            catch_up_bytes=target - start_offset,
            catch_up_mb_s=round(rate, 1),
            catch_up_s=round(t_done - t_resume, 2),
            put_p99_baseline_ms=round(_p99(baseline), 2),
            put_p99_after_ms=round(_p99(after), 2),
            put_p99_during_ms=round(_p99(during), 2),
            puts_during=len(during),
            master_anon_growth_mb=round((peak["RssAnon"] - mem_before["RssAnon"]) / 2**20, 1),
            master_file_growth_mb=round((peak["RssFile"] - mem_before["RssFile"]) / 2**20, 1),
        )

        def checks(summary: dict[str, Any]) -> list[str]:
            problems = []
            if judge_perf and rate < RATE_FLOOR_MB_S:
                problems.append(f"catch-up {rate:.1f} MB/s < {RATE_FLOOR_MB_S} MB/s")
            if peak["RssAnon"] - mem_before["RssAnon"] >= ANON_GROWTH_LIMIT:
                problems.append(f"master anonymous memory grew {summary['master_anon_growth_mb']}"
                                " MiB during the catch-up")
            if len(during) < 10:
                problems.append(f"only {len(during)} puts answered during the catch-up")
            elif judge_perf and capped and _p99(during) > P99_FACTOR * max(reference, 1.0):
                problems.append(f"put p99 {_p99(during):.2f} ms during catch-up > "
                                f"{P99_FACTOR}x baseline {reference:.2f} ms (before "
                                f"{_p99(baseline):.2f}, after {_p99(after):.2f})")
            return problems

        result = drill.finish(m, [s], extra_checks=checks)
        assert result["verdict"] == "pass", result["problems"]
