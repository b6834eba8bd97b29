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


# ---- what a failed test leaves: its brokers' logs ------------------------------------------------
FAILURE_DIR = "test-failures"
LOG_TAIL_LINES = 400  # per log file
MAX_LOGS = 12
# In the report itself (a CI record may hold only the terminal's output, not build/): each log's
# warnings, errors and changes of role or replica set, the last few, cut short.
NOTABLE_LEVELS = ("level=WARNING", "level=ERROR", "level=CRITICAL")
NOTABLE_EVENTS = ("event=controller_elected", "event=controller_follows",
                  "event=controller_sync_state_set", "event=ha_sync_state_set_change",
                  "event=broker_elected_master", "event=broker_follows",
                  "event=controller_took_over",
                  "fsync-ing the write ahead log", "Expiring session")  # ZooKeeper's
NOTABLE_PER_LOG = 25
NOTABLE_CHARS = 300


def _logs_of(item: pytest.Item) -> list[Path]:
    """The broker (and ZooKeeper) logs a test made: under its ``tmp_path``, and those of any
    broker fixture it used (module-scoped brokers live elsewhere)."""
    found: list[Path] = []
    funcargs = getattr(item, "funcargs", {})
    tmp = funcargs.get("tmp_path")
    if isinstance(tmp, Path) and tmp.is_dir():
        found += sorted(tmp.rglob("*.log"))
    for value in funcargs.values():
        path = getattr(value, "log_path", None)
        if isinstance(path, Path) and path.is_file() and path not in found:
            found.append(path)
    return found[:MAX_LOGS]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A process test that fails keeps the tails of its brokers' logs in
    ``build/test-failures/<test>.txt`` (pytest's temporary directories are pruned three runs
    later, and a loaded run's rare failure is worth nothing without them), after the failure
    itself (a CI log cut short may not hold it); the report names the file."""
    report = yield
    if report.failed and not hasattr(item.config, "workerinput"):
        logs = _logs_of(item)
        if logs:
            out = item.config.rootpath / "build" / FAILURE_DIR
            out.mkdir(parents=True, exist_ok=True)
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in item.nodeid)[:200]
            target = out / f"{name}.{report.when}.txt"
            with open(target, "w", encoding="utf-8") as f:
                f.write(f"==== {item.nodeid} ({report.when})\n{report.longreprtext}\n")
                for log in logs:
                    lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                    f.write(f"==== {log} (last {len(lines)} lines)\n")
                    f.write("\n".join(lines) + "\n")
            report.sections.append(("broker logs", f"tails of {len(logs)} logs in {target}"))
            report.sections.append(("broker log events", _notable(logs)))
    return report


def _notable(logs: list[Path]) -> str:
    """The last ``NOTABLE_PER_LOG`` notable lines of each log (``NOTABLE_LEVELS``,
    ``NOTABLE_EVENTS``), each cut to ``NOTABLE_CHARS``."""
    out: list[str] = []
    for log in logs:
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if any(m in line for m in NOTABLE_LEVELS + NOTABLE_EVENTS)]
        out.append(f"== {log.parent.name}/{log.name}: {len(lines)} notable lines"
                   + (f", the last {NOTABLE_PER_LOG}" if len(lines) > NOTABLE_PER_LOG else ""))
        out += [line[:NOTABLE_CHARS] for line in lines[-NOTABLE_PER_LOG:]]
    return "\n".join(out)
