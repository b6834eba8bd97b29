"""``replog drill --backend process`` (docs/drills.md "replog drill"): the command starts a
local controller-mode group, SIGKILLs, restarts and pauses its master under load with the
scenario the docker drill runs, and reports lost = 0, unexpected = 0 and replicas identical by
the checksums the brokers report; transactions run beside, none rolled back consumed, none
committed lost. Faults it cannot inject are refused before anything starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from broker_harness import REPO, _child_env
from controller_harness import need_zookeeper

pytestmark = [pytest.mark.drill, pytest.mark.integration]


def replog_drill(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "common.cli", "drill", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          check=False, env=_child_env())


@pytest.mark.timeout(420)
def test_process_drill_kills_restarts_and_pauses_the_master(tmp_path: Path) -> None:
    need_zookeeper()
    history = tmp_path / "history.jsonl"
    done = replog_drill("--backend", "process", "--faults", "kill=2,restart=1,pause=1",
                        "--dir", str(tmp_path / "group"), "--base-port", "13911",
                        "--history", str(history), "--seed", "11", "--json", timeout_s=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["verdict"] == "pass" and report["problems"] == []
    assert report["lost"] == 0 and report["unexpected"] == 0 and report["ok"] > 500
    assert report["mode"] == "SYNC_MASTER" and report["backend"] == "process"
    assert sorted(f["status"] for f in report["faults"]) == ["kill", "kill", "pause", "restart"]
    for f in report["faults"]:
        assert f["epoch_after"] > f["epoch_before"], f  # each one handed the group over
        assert f["rto_s"] is not None and f["rto_s"] < 30, f
    assert report["checksums"]["identical"] and len(set(report["checksums"]["by_node"])) == 3
    lo, hi = report["checksums"]["range"]
    assert hi > lo and report["converged_max"] == hi
    assert report["failover_p50_s"] is not None and report["failover_max_s"] >= \
        report["failover_p50_s"]
    tx = report["transactions"]  # one transaction producer by default, checked
    assert tx["tx_committed"] > 50 and tx["tx_rolled_back"] > 30, tx
    assert tx["tx_rolled_back_consumed"] == tx["tx_committed_lost"] == 0, tx
    assert tx["tx_consumed_before_commit"] == tx["tx_both"] == 0, tx
    assert tx["check_backs_answered"] > 0, tx  # the UNKNOWN ones, decided by the check-back
    assert not history.exists()  # kept only when the drill fails


@pytest.mark.timeout(60)
def test_faults_a_backend_cannot_inject_are_refused_before_anything_starts(
        tmp_path: Path) -> None:
    done = replog_drill("--backend", "process", "--faults", "kill=1,partition-zk=1",
                        "--dir", str(tmp_path / "group"), timeout_s=50)
    assert done.returncode == 2 and "cannot partition" in done.stderr, done.stderr
    assert not (tmp_path / "group").exists()
    done = replog_drill("--faults", "kil=1", timeout_s=50)
    assert done.returncode == 2 and "unknown fault 'kil'" in done.stderr, done.stderr
