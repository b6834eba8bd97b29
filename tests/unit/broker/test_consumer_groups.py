"""Group membership by heartbeats and RocketMQ's average allocation."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from common.broker.consumer_groups import ConsumerGroups
from common.core.allocation import allocate_averagely

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_members_expire_after_their_session_timeout_and_leave_at_once() -> None:
    clock = Clock()
    g = ConsumerGroups(clock)
    assert g.heartbeat("billing", "b", 3000) == ["b"]
    assert g.heartbeat("billing", "a", 3000) == ["a", "b"]
    assert g.heartbeat("other", "x", 3000) == ["x"]
    clock.t += 2.9
    assert g.heartbeat("billing", "a", 3000) == ["a", "b"]  # b: 2.9 s of its 3 s session
    clock.t += 0.2
    assert g.heartbeat("billing", "a", 3000) == ["a"]  # b: not heard from for 3.1 s
    assert g.members("other") == []  # and x too, seen by any look
    assert g.heartbeat("billing", "a", 3000, leave=True) == []
    assert g.groups() == {}


def test_a_leave_for_an_unknown_group_creates_nothing() -> None:
    g = ConsumerGroups(Clock())
    assert g.heartbeat("ghost", "a", 1000, leave=True) == []
    assert g.groups() == {}


@pytest.mark.parametrize("n_queues", [1, 3, 4, 7, 8])
@pytest.mark.parametrize("n_members", [1, 2, 3, 5])
def test_allocation_is_a_partition_in_contiguous_runs(n_queues: int, n_members: int) -> None:
    queues = [("t", q) for q in range(n_queues)]
    members = [f"m{i}" for i in range(n_members)]
    shares = [allocate_averagely(queues, members, m) for m in members]
    assert [q for share in shares for q in share] == queues  # each queue once, in order
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert allocate_averagely(queues, members, "stranger") == []


def test_a_broadcasting_members_offsets_file(tmp_path: Path) -> None:
    """LocalOffsets: consumerOffset.json's shape, written whole at each commit; other groups'
    entries in the same file are kept; a damaged file is refused, naming it, and left as is."""
    from common.client.group_consumer import LocalOffsets, default_offsets_path

    path = tmp_path / "o" / "offsets.json"
    store = LocalOffsets(path, "bc")
    assert store.get(("t", 0)) == -1
    store.put_all({("t", 0): 5, ("t", 3): 9})
    store.put_all({("t", 0): 7})
    again = LocalOffsets(path, "bc")
    assert (again.get(("t", 0)), again.get(("t", 3)), again.get(("t", 1))) == (7, 9, -1)
    assert json.loads(path.read_text()) == {"offsetTable": {"t@bc": {"0": 7, "3": 9}}}
    other = LocalOffsets(path, "other")
    assert other.get(("t", 0)) == -1
    other.put_all({("t", 1): 4})
    assert LocalOffsets(path, "bc").get(("t", 3)) == 9 and LocalOffsets(path, "other").get(
        ("t", 1)) == 4
    path.write_text('{"offsetTable": {"t@bc": {"0": "seven"}}}')
    with pytest.raises(ValueError, match=str(path)):
        LocalOffsets(path, "bc")
    assert "seven" in path.read_text()
    assert default_offsets_path("g", None).parts[-4:-1] == (
        ".replog_offsets", f"{socket.gethostname()}@DEFAULT", "g")
