"""A broker whose request I/O thread dies says so and exits non-zero (issue 21, item 1).

The I/O thread owns the client socket and every request in flight, so it is not restarted in
place: the broker logs the death at ERROR, shuts down cleanly (flush, checkpoint, abort file
removed) and exits with status 70 (EX_SOFTWARE) for its supervisor to restart it. Before, the
thread died alone and the process went on without serving anything. ``io_crash/
sitecustomize.py`` injects the failure into one broker process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from broker_harness import REPO, BrokerProcess, brokers

from common.broker.broker import EXIT_INTERNAL_ERROR
from common.broker.server import RequestServer
from common.client import Producer
from common.core.errors import SendStatus

pytestmark = pytest.mark.integration

CRASH_DIR = Path(__file__).resolve().parent / "io_crash"
EXIT_DEADLINE_S = 60.0  # drain (10 s at most, nothing in flight here) + role stop + store flush


@pytest.mark.timeout(120)
def test_a_broker_whose_io_thread_dies_logs_it_and_exits_non_zero(tmp_path: Path) -> None:
    # what io_crash/sitecustomize.py patches: the loop calls it on every pass
    assert callable(getattr(RequestServer, "_poll_timeout_ms", None)), \
        "update io_crash/sitecustomize.py"
    crash = tmp_path / "crash-now"
    b = BrokerProcess(tmp_path / "b", extra_env={
        "PYTHONPATH": f"{CRASH_DIR}{os.pathsep}{REPO}", "TEST_IO_CRASH_FILE": str(crash)})
    with brokers(b):
        with Producer([b.address]) as p:
            assert p.send("t", b"before", queue_id=0).status == SendStatus.SEND_OK
        crash.touch()
        assert b.proc is not None
        status = b.proc.wait(EXIT_DEADLINE_S)  # before: the process lived on, serving nothing
        assert status == EXIT_INTERNAL_ERROR, b.log_tail()
        lines = b.log_path.read_text().splitlines()
        died = [line for line in lines if "event=io_thread_died" in line]
        fatal = [line for line in lines if "event=broker_fatal" in line]
        assert died and "level=ERROR" in died[0] and "injected" in died[0], b.log_tail()
        assert fatal and "level=ERROR" in fatal[0]
        assert any("event=store_stopped clean=True" in line for line in lines), b.log_tail()
        assert not (b.store_root / "abort").exists()  # a clean shutdown, not a crash
