"""Real broker processes for integration tests: free ports, own directories, stopped by pid.

``BrokerProcess`` writes a YAML config, runs ``python -m common.cli broker -c FILE`` and waits
(with a deadline) until the broker answers STATUS. ``close()`` SIGKILLs whatever is still alive,
so a test's ``finally`` (or the ``brokers`` context manager) always leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.client import Admin
from common.core import ports
from common.core.config import dump_yaml, load_config
from common.core.errors import BrokerError

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0


def free_port(span: int = 3) -> int:
    """A port p with p..p+span-1 free right now (client, HA and metrics ports), below the
    kernel's ephemeral range (``common.core.ports``)."""
    return ports.free_port(span)


class BrokerProcess:
    def __init__(self, home: Path, extra_env: dict[str, str] | None = None,
                 client_curve: dict[str, Any] | None = None, **fields: Any):
        """``client_curve``: the key/server_key the harness's own clients use (aclEnable)."""
        self.home = home
        self.extra_env = dict(extra_env or {})
        self.client_curve = dict(client_curve or {})
        self.port = fields.pop("listenPort", None) or free_port()
        defaults: dict[str, Any] = {
            "listenPort": self.port,
            "haListenPort": self.port + 1,
            "storePathRootDir": str(home / "store"),
            "mappedFileSizeCommitLog": 16 * 1024 * 1024,
            "mappedFileSizeConsumeQueue": 30_000 * 20,
        }
        self.cfg = load_config(None, (), env={}, **{**defaults, **fields})
        self.config_path = home / "broker.yaml"
        self.log_path = home / "broker.log"
        home.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(dump_yaml(self.cfg))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def store_root(self) -> Path:
        return Path(self.cfg.storePathRootDir)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> BrokerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "common.cli", "broker", "-c", str(self.config_path)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**_child_env(), **self.extra_env},
            )
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with Admin([self.address], timeout_ms=500, retries=0, **self.client_curve) as admin:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"broker exited {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    admin.status(self.address)
                    return
                except BrokerError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"broker not ready:\n{self.log_tail()}") from None

    def status(self) -> dict[str, Any]:
        with Admin([self.address], timeout_ms=3000, retries=0, **self.client_curve) as admin:
            return admin.status(self.address)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the clean exit; returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLOG_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@contextlib.contextmanager
def brokers(*procs: BrokerProcess) -> Iterator[tuple[BrokerProcess, ...]]:
    """Start them all; kill every one by pid on the way out, whatever happened."""
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.close()


def run_cli(*args: str, timeout_s: float = 60.0,
            env: dict[str, str] | None = None) -> tuple[int, Any]:
    """``replog ARGS --json`` in a subprocess -> (exit status, parsed JSON or None); ``env``
    is added to the child's environment (from which REPLOG_* variables are removed)."""
    done = subprocess.run(
        [sys.executable, "-m", "common.cli", *args, "--json"],
        check=False,
        cwd=REPO,
        capture_output=True,
        timeout=timeout_s,
        env={**_child_env(), **(env or {})},
    )
    text = done.stdout.decode().strip()
    return done.returncode, (json.loads(text) if text else None)


def tree_digest(root: Path) -> dict[str, tuple[int, str]]:
    """Relative path -> (size, sha256) of every file below ``root``."""
    import hashlib

    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = (
                path.stat().st_size,
                hashlib.sha256(path.read_bytes()).hexdigest(),
            )
    return out
