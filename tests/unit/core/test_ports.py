"""Free ports for test and benchmark servers come from below the kernel's ephemeral range.

A port taken from port 0 is in the range every outgoing connection on the machine draws from; a
benchmark beside a test run lost its haListenPort that way ("haListenPort 49362 is in use").
Every helper that picks a port for a server to bind later must stay out of that range."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from common.core import ports

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def ephemeral() -> tuple[int, int]:
    first, last = (int(x) for x in ports.EPHEMERAL_RANGE_FILE.read_text().split()[:2])
    return first, last


def load(name: str, path: Path) -> Any:
    """A module of bench/ or tests/integration/ by its path, sys.path untouched."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def pickers() -> list[tuple[str, Any]]:
    """Every free-port helper of the repository, as (name, callable of span)."""
    from helpers import brokers

    from common.cli import zookeeper

    bench = load("_support", REPO / "bench" / "_support.py")
    harness = load("broker_harness", REPO / "tests" / "integration" / "broker_harness.py")
    return [("ports", ports.free_port), ("bench", bench.free_port),
            ("broker_harness", harness.free_port),
            ("helpers.brokers", lambda span: brokers.free_port()),
            ("zookeeper", lambda span: zookeeper.free_port())]


@pytest.mark.parametrize("name", [name for name, _ in pickers()])
def test_every_picker_stays_below_the_ephemeral_range(name: str) -> None:
    pick = dict(pickers())[name]
    first, last = ephemeral()
    for _ in range(50):
        port = pick(1)
        assert not first <= port <= last, f"{name} gave {port}, in {first}-{last}"
        assert ports.is_free(port)


def test_a_span_is_free_and_outside_the_range() -> None:
    first, last = ephemeral()
    for _ in range(20):
        port = ports.free_port(3)
        assert all(ports.is_free(port + i) for i in range(3))
        assert port + 2 < first or port > last


def test_a_bound_port_is_not_free() -> None:
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
        s.listen(1)
        assert not ports.is_free(port)
    loopback = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", loopback))
        assert not ports.is_free(loopback)


def test_the_range_follows_the_kernel_setting(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    setting = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", setting)
    setting.write_text("40000\t50000\n")
    assert ports.unassigned_range() == (ports.LOWEST, 40000)
    setting.write_text("1024 30000\n")  # an ephemeral range at the bottom: above it
    assert ports.unassigned_range() == (30001, 65536)
    assert 30001 <= ports.free_port(2) <= 65534
    setting.unlink()  # unreadable: Linux's default
    assert ports.unassigned_range() == (ports.LOWEST, 32768)


def test_a_bad_span_is_refused() -> None:
    with pytest.raises(ValueError):
        ports.free_port(0)


def test_spans_handed_out_one_after_another_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Brokers made before any binds (a controller group, p and p+1 each) are given disjoint
    spans: nothing is bound yet to tell them apart, so the helper remembers what it handed out
    (a CI run saw one member's HA port given to another as its client port). The range is
    narrowed to 60 ports so that, without the memory, 20 spans of 3 would collide."""
    monkeypatch.setattr(ports, "unassigned_range", lambda: (41000, 41060))
    monkeypatch.setattr(ports, "_handed", {})
    taken: set[int] = set()
    for _ in range(10):
        port = ports.free_port(3)
        span = {port, port + 1, port + 2}
        assert not span & taken, f"{sorted(span)} overlaps what was handed out"
        taken |= span
