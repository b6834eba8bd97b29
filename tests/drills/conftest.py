"""Failover drills (docs/drills.md): real broker processes, SIGKILL / SIGSTOP, promotion.

The drills reuse the process helpers of ``tests/integration`` (free ports, brokers by pid,
relay, deadline waits); that directory goes on ``sys.path`` here. At the end of the session
every drill's JSON result is printed with a closing ``N passed, N failed`` line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_INTEGRATION = str(Path(__file__).resolve().parents[1] / "integration")
if _INTEGRATION not in sys.path:
    sys.path.insert(0, _INTEGRATION)

import harness
import pytest

_XFAILED: set[str] = set()


@pytest.fixture(autouse=True)
def _drill_test_id(request: pytest.FixtureRequest) -> None:
    harness.CURRENT_TEST = request.node.nodeid


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and hasattr(report, "wasxfail") and report.skipped:
        _XFAILED.add(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not harness.RESULTS:
        return
    terminalreporter.section("replog drills")
    for result in harness.RESULTS:
        terminalreporter.write_line(json.dumps(result, sort_keys=True))
    passed = sum(1 for r in harness.RESULTS if r.get("verdict") == "pass")
    xfailed = sum(
        1 for r in harness.RESULTS if r.get("verdict") != "pass" and r.get("test") in _XFAILED
    )
    failed = len(harness.RESULTS) - passed - xfailed
    terminalreporter.write_line(
        f"{passed} passed, {failed} failed"
        + (f", {xfailed} xfailed (known bugs)" if xfailed else "")
    )
