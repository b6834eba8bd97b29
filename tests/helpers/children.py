"""A ``replog`` command run as a child process by a test: started, waited for until it prints
its ready line (``--json``), and stopped on the way out by pid whatever happened: SIGTERM (and,
when the test body passed, an exit status of 0 is asserted), then SIGKILL if it is still
there."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def replog_child(*args: str, ready: str, log: Path,
                 env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m common.cli ARGS`` with stderr into ``log``; yields (process, its first
    stdout line), which must hold ``ready`` (else the log's tail is the failure). The child's
    environment is the test's without ``REPLOG_*``, plus ``env``."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("REPLOG_")}
    child_env["PYTHONPATH"] = str(REPO)
    child_env.update(env or {})
    with log.open("ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "common.cli", *args],
                                stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=child_env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert ready in line, log.read_text()[-2000:]
        yield proc, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
