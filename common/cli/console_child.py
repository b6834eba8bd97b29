"""``replog console`` as a child process of ``replog cluster up`` (``common/cli/console.py``
is the command itself)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any


class ConsoleChild:
    """``replog console`` as a child process of ``replog cluster up``: over the cluster's
    brokers, on ``127.0.0.1:port``, with a random admin password written to
    ``directory/console.password`` (mode 0600) on first use; ``start`` returns once it
    listens (or raises RuntimeError with its log), ``stop`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, directory: Path, servers: list[str], port: int,
                 curve: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None):
        """``prefix``: the command's prefix (``cluster.die_with_parent``: it ends with its
        parent, kill -9 included)."""
        self.prefix = list(prefix or [])
        self.directory, self.servers, self.port = directory, servers, port
        self.curve = curve or {}
        self.env = env
        self.password_file = directory / "console.password"
        self.log_path = directory / "console.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}/"

    def start(self, timeout_s: float = 30.0) -> None:
        if not self.password_file.exists():
            fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(18) + "\n")
        args = [*self.prefix, sys.executable, "-m", "common.cli", "console", "-s", ",".join(self.servers),
                "--listen", f"127.0.0.1:{self.port}", "--admin-password-file",
                str(self.password_file), "--json"]
        if self.curve:
            args += ["--key", str(self.curve["key"]), "--server-key",
                     str(self.curve["server_key"])]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                                            env=self.env)
        ready: list[bytes] = []
        reader = threading.Thread(target=lambda: ready.append(
            self.process.stdout.readline()  # type: ignore[union-attr]
        ), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not ready or str(self.port).encode() not in ready[0]:
            self.stop()
            raise RuntimeError(f"the console did not start: {self.log_path.read_text()[-1500:]}")

    def stop(self) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "pid": self.process.pid if self.process else None,
                "passwordFile": str(self.password_file), "log": str(self.log_path)}
