"""tests/fatal_report.py: what `make test` prints when pytest dies of a signal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fatal_report import report

CRASH = """
import faulthandler, os, sys, threading, time
faulthandler.enable(file=open(sys.argv[1], "w"), all_threads=True)
def worker_that_aborts():
    os.abort()
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
threading.Thread(target=worker_that_aborts).start()
time.sleep(30)
"""


@pytest.mark.timeout(60)
def test_names_the_test_and_the_thread_that_crashed(tmp_path: Path) -> None:
    (tmp_path / "test-current").write_text("tests/x.py::test_y\n")
    child = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path / "test-fatal.log")],
                           check=False, capture_output=True, timeout=50)
    assert child.returncode == -6
    text = report(128 + 6, tmp_path)
    lines = text.splitlines()
    assert lines[0] == "pytest died of SIGABRT (status 134) while running tests/x.py::test_y"
    assert "Fatal Python error: Aborted" in lines
    current = lines.index(next(line for line in lines if line.startswith("Current thread")))
    assert "in worker_that_aborts" in lines[current + 1]  # the crashed thread, innermost first
    assert not any("in <module>" in line for line in lines[current:])  # not the main thread


def test_without_a_dump_it_still_names_the_test(tmp_path: Path) -> None:
    (tmp_path / "test-current").write_text("tests/x.py::test_z\n")
    text = report(128 + 11, tmp_path)
    assert text.splitlines()[0] == (
        "pytest died of SIGSEGV (status 139) while running tests/x.py::test_z"
    )
