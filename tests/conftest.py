"""Run-wide: when the test process itself dies of a signal, leave enough to say where.

A C library's assertion (libzmq aborts on a broken invariant) or a crash kills pytest with
SIGABRT or SIGSEGV. pytest's faulthandler plugin then prints every thread's stack to stderr;
a drill runs some 25 threads, so that is hundreds of lines, and the tail of a CI log shows only
the main thread's pytest frames: neither the test nor the thread that crashed. Here the dump
goes to ``build/test-fatal.log`` and each test's node id to ``build/test-current``;
``make test`` prints both, short, when pytest dies of a signal (``tests/fatal_report.py``).
"""

from __future__ import annotations

import faulthandler
from pathlib import Path
from typing import IO

import pytest

_dump: IO[str] | None = None
_current: Path | None = None


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin, whose target this replaces
def pytest_configure(config: pytest.Config) -> None:
    global _dump, _current
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its controller reports
    out = config.rootpath / "build"
    out.mkdir(parents=True, exist_ok=True)
    _current = out / "test-current"
    _current.unlink(missing_ok=True)
    _dump = open(out / "test-fatal.log", "w", encoding="utf-8")  # noqa: SIM115 - closed below
    faulthandler.enable(file=_dump, all_threads=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _dump
    if _dump is not None:
        faulthandler.disable()
        _dump.close()
        _dump = None


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _current is not None:
        _current.write_text(nodeid + "\n", encoding="utf-8")
