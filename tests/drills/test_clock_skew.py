"""Clock skew (docs/drills.md row 15), PR tier.

Row 1's drill (SYNC_MASTER, SIGKILL the master at a random time, promote the slave, restart
the old master as its slave; producers and a consumer throughout) with one broker's wall clock
30 s ahead, then 30 s behind. ``clock_skew/sitecustomize.py`` skews the broker's Python wall
clock (``time.time``/``time_ns``, ``datetime.now``) as libfaketime would, without needing it on
the machine; monotonic clocks are untouched. The log then holds store timestamps that jump by
a minute at every failover (and the IndexFile's timestamps with them). The drill checks there is
no safety change: lost = 0, unexpected = 0, byte-identical logs, every acknowledged key found
through the index on both replicas; and that the skew was real (records stored by the skewed
broker carry its clock).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from harness import QUEUES, TOPIC, Drill, Node, wait_more_puts

from common.client import Admin, Consumer

pytestmark = [pytest.mark.drill, pytest.mark.integration]

SKEW_DIR = Path(__file__).resolve().parent / "clock_skew"
REPO = Path(__file__).resolve().parents[2]
CYCLES = int(os.environ.get("DRILL_SKEW_CYCLES", "2"))
SKEW_S = 30.0


def _skew(node: Node, seconds: float) -> None:
    node.extra_env = {"PYTHONPATH": f"{SKEW_DIR}{os.pathsep}{REPO}",
                      "DRILL_CLOCK_SKEW_S": str(seconds)}


def _store_times_s(address: str) -> list[float]:
    """Store timestamps (s) of every message in the drill topic, read from ``address``."""
    out = []
    with Consumer([address], timeout_ms=5000, retries=1) as c:
        for q in range(QUEUES):
            offset = 0
            while True:
                pr = c.pull(TOPIC, queue_id=q, offset=offset, max_nums=256)
                if not pr.messages:
                    break
                out += [m.store_timestamp / 1000 for m in pr.messages]
                offset = pr.next_begin_offset
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S], ids=["ahead-30s", "behind-30s"])
def test_sync_failovers_with_one_broker_clock_skewed(tmp_path: Path, skew: float) -> None:
    wall_from = time.time()
    with Drill(f"clock-skew-{'ahead' if skew > 0 else 'behind'}", tmp_path) as drill:
        a = drill.node("a", slave_id=1)
        b = drill.node("b", slave_id=2)
        _skew(a, skew)
        drill.start_group(a, "SYNC_MASTER", b)
        servers = [a.address, b.address]
        drill.add_load(servers, 3, 60.0)
        master, slave = a, b
        for cycle in range(CYCLES * 2):  # each broker is killed as master CYCLES times
            wait_more_puts(drill.history, 30, 30)
            master.kill()
            drill.promote(slave, cli=cycle % 2 == 0)
            master.start("SLAVE", master=slave)
            drill.wait_slave_in_sync(slave)
            master, slave = slave, master
        wait_more_puts(drill.history, 30, 30)
        wall_to = time.time()

        def checks(summary: dict[str, object]) -> list[str]:
            times = _store_times_s(master.address)
            skewed = [t for t in times if abs(t - skew - (wall_from + wall_to) / 2)
                      <= (wall_to - wall_from) / 2 + 5]
            plain = [t for t in times if wall_from - 5 <= t <= wall_to + 5]
            summary.update(skew_s=skew, stored_by_skewed=len(skewed),
                           stored_by_plain=len(plain), messages_read=len(times))
            problems = []
            # the IndexFile too: every acknowledged key is found on both replicas
            acked = [e["msg_id"] for e in drill.history.events
                     if e["op"] == "put" and e["type"] == "ok"]
            unfound = {}
            with Admin(servers, timeout_ms=5000, retries=1) as c:
                for node in (master, slave):
                    unfound[node.name] = sum(
                        1 for m in acked
                        if not any(x.keys == m for x in c.query_by_key(TOPIC, m,
                                                                         address=node.address)))
            summary.update(keys_not_found=unfound)
            if any(unfound.values()):
                problems.append(f"acknowledged keys missing from the index: {unfound}")
            if not skewed or not plain:
                problems.append(f"expected records stamped by both clocks: {len(skewed)} "
                                f"skewed, {len(plain)} plain of {len(times)}")
            return problems

        summary = drill.finish(master, [slave], extra_checks=checks)
        assert summary["verdict"] == "pass", summary["problems"]
