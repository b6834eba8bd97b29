"""Keys, ACL files and raw CURVE sockets for the security tests (docs/security.md).

``Realm`` holds a directory of key pairs (``broker``: the group's pair; the others: client or
replica accounts) and writes the ACL file from plain account dicts, atomically (a rename, as an
operator's editor or config management would), so the broker's poller never reads half a file.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
import zmq
from helpers.zmq_sockets import SEND_TIMEOUT_MS, bounded_socket
from prometheus_client.parser import text_string_to_metric_families

from common.core.keys import load_public, load_secret, new_key_pair

RELOAD_MS = 300  # aclReloadIntervalMs of the test brokers


class Realm:
    def __init__(self, root: Path, names: Iterable[str] = ()):
        self.root = root
        self.keys = root / "keys"
        self.acl_path = root / "acl.yml"
        for name in {"broker", "admin", *names}:
            self.key(name)

    def key(self, name: str) -> Path:
        """``name``'s .key_secret (made on first use)."""
        secret = self.keys / f"{name}.key_secret"
        if not secret.exists():
            new_key_pair(self.keys, name)
        return secret

    def pub(self, name: str) -> str:
        self.key(name)
        return load_public(self.keys / f"{name}.key").public.decode("ascii")

    def curve(self, name: str, server: str = "broker") -> dict[str, Any]:
        """Client arguments: ``name``'s key, pinning ``server``'s public key."""
        self.key(server)
        return {"key": str(self.key(name)), "server_key": str(self.keys / f"{server}.key")}

    def account(self, name: str, **fields: Any) -> dict[str, Any]:
        return {"accessKey": name, "curvePublicKey": self.pub(name), **fields}

    def write_acl(self, accounts: list[dict[str, Any]], mode: int = 0o644) -> None:
        self.write_acl_text(yaml.safe_dump({"accounts": accounts}, sort_keys=False), mode)

    def write_acl_text(self, text: str, mode: int = 0o644) -> None:
        """Written whole with ``mode`` (0600 for a file holding secretKeys), then renamed in."""
        temp = self.acl_path.with_name(self.acl_path.name + ".tmp")
        temp.unlink(missing_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(temp, mode)  # whatever the umask took away
        os.replace(temp, self.acl_path)

    def broker_fields(self, broker_key: str = "broker", master_key: str | None = None,
                      **extra: Any) -> dict[str, Any]:
        fields = {"aclEnable": True, "aclFile": str(self.acl_path),
                  "curveSecretKeyFile": str(self.key(broker_key)),
                  "aclReloadIntervalMs": RELOAD_MS}
        if master_key is not None:
            self.key(master_key)
            fields["haMasterPublicKeyFile"] = str(self.keys / f"{master_key}.key")
        return {**fields, **extra}

    def dealer(self, ctx: zmq.Context[Any], name: str, port: int, server: str = "broker",
               routing_id: bytes | None = None,
               send_timeout_ms: int = SEND_TIMEOUT_MS) -> zmq.Socket[Any]:
        """A raw CURVE DEALER of ``name`` to 127.0.0.1:``port`` (``bounded_socket``)."""
        pair = load_secret(self.key(name))
        assert pair.secret is not None
        sock = bounded_socket(ctx, zmq.DEALER, send_timeout_ms=send_timeout_ms)
        sock.curve_publickey = pair.public
        sock.curve_secretkey = pair.secret
        self.key(server)
        sock.curve_serverkey = load_public(self.keys / f"{server}.key").public
        if routing_id is not None:
            sock.routing_id = routing_id
        sock.connect(f"tcp://127.0.0.1:{port}")
        return sock


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str,
               step_s: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    event = threading.Event()
    last: Any = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} ({last!r})")
        event.wait(step_s)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, from one scrape of the broker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
