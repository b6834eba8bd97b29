"""The drill package's pure parts (common/drill): the fault list ``replog drill --faults``
takes, the order a seed draws, the verdict, which broker stored a record, and the clear error
when the Docker SDK is missing."""

from __future__ import annotations

import random
import sys

import pytest

from common.drill import scenario
from common.drill.backends import FAULTS, DrillError, DrillNode
from common.drill.backends.docker import docker_module
from common.drill.backends.process import ProcessBackend
from common.drill.checker import check_total_queue, judge, percentiles

pytestmark = pytest.mark.unit


def test_faults_parse_with_counts_and_repeats() -> None:
    assert scenario.parse_faults("kill=5, partition-zk=1,partition-slaves,pause=1,kill=2") == {
        "kill": 7, "partition-zk": 1, "partition-slaves": 1, "pause": 1}


@pytest.mark.parametrize(("text", "says"), [
    ("kil=1", "unknown fault 'kil'"),
    ("kill=x", "whole number"),
    ("kill=-1", ">= 0"),
    ("kill=0", "between 1 and"),
    ("", "between 1 and"),
    ("kill=1001", "between 1 and"),
])
def test_bad_fault_lists_are_refused_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        scenario.parse_faults(text)


def test_a_seed_replays_the_fault_order() -> None:
    counts = {"kill": 5, "pause": 1, "partition-zk": 1, "partition-slaves": 1}
    first = scenario.fault_order(counts, random.Random(42))
    assert first == scenario.fault_order(counts, random.Random(42))
    assert sorted(first) == sorted(["kill"] * 5 + ["pause", "partition-zk", "partition-slaves"])
    orders = {tuple(scenario.fault_order(counts, random.Random(s))) for s in range(20)}
    assert len(orders) > 1


def test_the_process_backend_refuses_partitions_only() -> None:
    backend = ProcessBackend([])
    for fault in FAULTS:
        reason = backend.unsupported(fault)
        assert bool(reason) == fault.startswith("partition"), fault
        if reason:
            assert "--backend docker" in reason


def test_a_node_stored_the_records_carrying_its_listen_port() -> None:
    node = DrillNode("broker-a-2", 2, "127.0.0.1:10921", 10921)
    assert node.stored("172.20.0.4:10921")
    assert not node.stored("172.20.0.4:10911") and not node.stored("?")


def test_a_missing_docker_sdk_says_to_install_the_drills_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # import docker -> ImportError
    with pytest.raises(DrillError, match=r"replog\[drills\]"):
        docker_module()


def _put(t: float, msg: str, kind: str, handler: str = "10.0.0.1:10911") -> list[dict]:
    return [{"t": t, "op": "put", "type": "invoke", "msg_id": msg},
            {"t": t + 0.01, "op": "put", "type": kind, "msg_id": msg, "handler": handler}]


def test_the_verdict_counts_lost_and_allowed_losses() -> None:
    events = (_put(1, "p0-1", "ok") + _put(2, "p0-2", "ok") + _put(3, "p0-3", "info")
              + _put(4, "p0-4", "fail"))
    final = {0: [(0, "p0-1", True), (1, "p0-3", True)]}
    summary = check_total_queue(events, final)
    assert (summary["lost"], summary["recovered"], summary["failed_but_read"]) == (1, 1, 0)
    problems = judge(dict(summary), logs_identical=True, compared_range=[0, 10],
                     replica_drains_equal=True)
    assert problems == ["lost=1"]
    allowed = dict(summary)
    assert judge(allowed, logs_identical=True, compared_range=[0, 10],
                 replica_drains_equal=True, loss_allowed={"p0-2"}.__contains__) == []
    assert allowed["lost_allowed"] == 1 and allowed["lost"] == 0
    assert "lost_ids_all" not in allowed
    problems = judge(check_total_queue(events, {0: [(0, "p0-1", True), (2, "x-9", False)]}),
                     logs_identical=False, compared_range=[0, 10], replica_drains_equal=False)
    assert problems == ["lost=1", "unexpected=1", "corrupt=1", "queue_gaps=1",
                        "replica CommitLogs differ in [0, 10]",
                        "replicas serve different messages"]


def test_percentiles() -> None:
    assert percentiles([]) == {"p50": None, "max": None}
    assert percentiles([5.0, 4.0, 4.5]) == {"p50": 4.5, "max": 5.0}
