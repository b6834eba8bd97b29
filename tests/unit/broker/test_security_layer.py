"""The broker's security layer in one process (common/broker/security.py): the bind guard, the
ZAP decisions, ACL reloads, audit rate limits, the libzmq check and the security thread."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.zmq_sockets import bounded_socket
from zmq.auth.thread import ThreadAuthenticator

from common.broker import security as sec_mod
from common.broker.security import (
    CLIENT_DOMAIN,
    HA_DOMAIN,
    Audit,
    InsecureBindError,
    Security,
    check_libzmq,
    require_authenticator,
)
from common.core.config import load_config
from common.core.errors import ConfigError
from common.core.keys import load_public, load_secret, new_key_pair
from common.format.acl import Denial

pytestmark = pytest.mark.unit

DEADLINE_S = 10.0


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    event = threading.Event()
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        event.wait(0.01)


class Keys:
    def __init__(self, root: Path):
        self.root = root / "keys"
        for name in ("broker", "admin", "app", "stranger", "replica", "retired"):
            new_key_pair(self.root, name)

    def pub(self, name: str) -> str:
        return load_public(self.root / f"{name}.key").public.decode()

    def secret(self, name: str) -> Path:
        return self.root / f"{name}.key_secret"


def acl_text(keys: Keys, extra: str = "") -> str:
    return (
        "accounts:\n"
        f'  - accessKey: admin\n    curvePublicKey: "{keys.pub("admin")}"\n    admin: true\n'
        f'  - accessKey: app\n    curvePublicKey: "{keys.pub("app")}"\n'
        "    defaultTopicPerm: PUB|SUB\n"
        f'  - accessKey: broker\n    curvePublicKey: "{keys.pub("replica")}"\n'
        "    replica: true\n"
        f'  - accessKey: retired\n    curvePublicKey: "{keys.pub("retired")}"\n'
        "    enabled: false\n" + extra)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


@pytest.fixture
def make_security(tmp_path: Path, keys: Keys) -> Iterator[Callable[..., Security]]:
    made: list[Security] = []

    def make(start: bool = False, **fields: Any) -> Security:
        acl = tmp_path / "acl.yml"
        if not acl.exists():
            acl.write_text(acl_text(keys))
        cfg = load_config(None, (), env={}, aclEnable=True, aclFile=str(acl),
                          curveSecretKeyFile=str(keys.secret("broker")), **fields)
        security = Security.from_config(cfg)
        made.append(security)
        if start:
            security.start()
        return security

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def client(ctx: zmq.Context[Any], keys: Keys, name: str, server_pub: bytes,
           endpoint: str) -> zmq.Socket[Any]:
    pair = load_secret(keys.secret(name))
    sock = bounded_socket(ctx, zmq.DEALER)
    sock.curve_publickey = pair.public
    assert pair.secret is not None
    sock.curve_secretkey = pair.secret
    sock.curve_serverkey = server_pub
    sock.connect(endpoint)
    return sock


def echo_once(server: zmq.Socket[Any], timeout_ms: int = 3000) -> str | None:
    """Answer one request on ``server``; returns its ZAP User-Id, or None if none came."""
    if not server.poll(timeout_ms):
        return None
    head = server.recv(copy=False)
    body = server.recv_multipart()
    server.send_multipart([head.bytes, *body])
    return sec_mod.user_id(head)


# ---- the pitfall and the guard -----------------------------------------------------------------


def test_without_a_zap_handler_curve_admits_any_key(ctx: zmq.Context[Any], keys: Keys) -> None:
    """Why the guard exists: libzmq lets in every client that knows the server's public key
    when no ZAP handler runs in the Context, zap_domain or not."""
    server_pair = load_secret(keys.secret("broker"))
    server = bounded_socket(ctx, zmq.ROUTER)
    assert server_pair.secret is not None
    server.curve_secretkey = server_pair.secret
    server.curve_publickey = server_pair.public
    server.curve_server = True
    server.zap_domain = CLIENT_DOMAIN.encode()
    port = server.bind_to_random_port("tcp://127.0.0.1")
    anyone = client(ctx, keys, "stranger", server_pair.public, f"tcp://127.0.0.1:{port}")
    anyone.send(b"let me in")
    assert echo_once(server) is not None  # admitted: nothing checked its key
    assert anyone.poll(3000)


def test_the_guard_refuses_a_bind_without_a_running_authenticator(
        make_security: Callable[..., Security], ctx: zmq.Context[Any]) -> None:
    security = make_security()
    sock = security.server_socket(ctx, zmq.ROUTER, CLIENT_DOMAIN)
    try:
        with pytest.raises(InsecureBindError, match="no ZAP authenticator"):
            security.bind(sock, "tcp://127.0.0.1:*")
        other: zmq.Context[Any] = zmq.Context()
        auth = security.start_authenticator(other)  # another Context: no help to this one
        try:
            with pytest.raises(InsecureBindError):
                security.bind(sock, "tcp://127.0.0.1:*")
        finally:
            assert auth is not None
            auth.stop()
            other.term()
        auth = security.start_authenticator(ctx)
        assert auth is not None
        auth.stop()  # stopped: refused again
        with pytest.raises(InsecureBindError):
            security.bind(sock, "tcp://127.0.0.1:*")
        assert not sock.getsockopt(zmq.LAST_ENDPOINT)  # never bound
    finally:
        sock.close(linger=0)


def test_the_guard_also_asks_libzmq_and_ignores_foreign_handlers(
        ctx: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    class Alive:
        context = ctx

        def is_alive(self) -> bool:
            return True

    monkeypatch.setitem(sec_mod._running, id(ctx), Alive())  # bookkeeping says yes...
    with pytest.raises(InsecureBindError, match="nothing is bound"):  # ...libzmq says no
        require_authenticator(ctx)
    monkeypatch.delitem(sec_mod._running, id(ctx))
    foreign = ThreadAuthenticator(ctx)  # someone else's handler: not ours, not trusted
    foreign.start()
    try:
        with pytest.raises(InsecureBindError, match="no ZAP authenticator"):
            require_authenticator(ctx)
    finally:
        foreign.stop()


def test_a_bound_server_admits_known_keys_only(make_security: Callable[..., Security],
                                               ctx: zmq.Context[Any], keys: Keys) -> None:
    security = make_security(start=True)
    auth = security.start_authenticator(ctx)
    server = security.server_socket(ctx, zmq.ROUTER, CLIENT_DOMAIN)
    monitor = security.handshake_monitor(server, CLIENT_DOMAIN)
    assert monitor is not None
    try:
        security.bind(server, "tcp://127.0.0.1:0")
        endpoint = server.getsockopt(zmq.LAST_ENDPOINT).decode()
        assert security.own is not None
        known = client(ctx, keys, "app", security.own.public, endpoint)
        known.send(b"hello")
        assert echo_once(server) == keys.pub("app")  # User-Id: the Z85 public key
        for name in ("stranger", "retired", "broker"):  # unknown, disabled, not in the ACL
            other = client(ctx, keys, name, security.own.public, endpoint)
            # not a blocking send: once the refused handshake has closed the connection (a
            # busy machine may run it between connect and send), a DEALER with no pipe
            # would block for ever
            with contextlib.suppress(zmq.Again):
                other.send(b"hello", zmq.NOBLOCK)
            assert echo_once(server, 500) is None
        wait_for(lambda: security.audit.counts()[1].get(("client", "CONNECT", "unknown_key"))
                 == 2, "two unknown keys audited")
        assert security.audit.counts()[1][("client", "CONNECT", "disabled")] == 1

        def refused_counted() -> bool:
            monitor.drain()  # what the socket's owner does when the monitor is readable
            return security.audit.counts()[0].get(("client", "refused"), 0) >= 3

        wait_for(refused_counted, "the monitor's count of refused handshakes")
        assert security.audit.counts()[0][("client", "ok")] >= 1
    finally:
        monitor.close()
        server.close(linger=0)
        assert auth is not None
        auth.stop()


def test_a_closed_handshake_monitor_leaves_the_socket_serving(
        make_security: Callable[..., Security], ctx: zmq.Context[Any], keys: Keys) -> None:
    """libzmq sends monitor events with a blocking send: a monitor closed while its socket
    still emits events stalls the Context's I/O thread, handshakes included. ``close``
    disables the events first."""
    security = make_security()
    auth = security.start_authenticator(ctx)
    server = security.server_socket(ctx, zmq.ROUTER, CLIENT_DOMAIN)
    monitor = security.handshake_monitor(server, CLIENT_DOMAIN)
    assert monitor is not None and auth is not None
    try:
        monitor.close()
        monitor.close()  # idempotent
        security.bind(server, "tcp://127.0.0.1:0")
        endpoint = server.getsockopt(zmq.LAST_ENDPOINT).decode()
        assert security.own is not None
        for _ in range(3):
            c = client(ctx, keys, "app", security.own.public, endpoint)
            c.send(b"hello")
            assert echo_once(server) == keys.pub("app")
            c.close(linger=0)
    finally:
        server.close(linger=0)
        auth.stop()


# ---- decisions -----------------------------------------------------------------------------------


def test_admit_reasons(make_security: Callable[..., Security], keys: Keys) -> None:
    security = make_security()
    assert security.admit(CLIENT_DOMAIN, keys.pub("app"), "127.0.0.1") == (True, "OK")
    assert security.admit(HA_DOMAIN, keys.pub("replica"), "127.0.0.1") == (True, "OK")
    ok, why = security.admit(HA_DOMAIN, keys.pub("app"), "127.0.0.1")
    assert not ok and "replica accounts only" in why
    ok, why = security.admit(CLIENT_DOMAIN, keys.pub("stranger"), "127.0.0.1")
    assert not ok and "no account" in why
    ok, why = security.admit(CLIENT_DOMAIN, keys.pub("retired"), "127.0.0.1")
    assert not ok and "disabled" in why
    ok, why = security.admit("other.domain", keys.pub("admin"), "127.0.0.1")
    assert not ok and "unknown ZAP domain" in why


def test_account_of_checks_the_acl_in_force_each_time(make_security: Callable[..., Security],
                                                      keys: Keys, tmp_path: Path) -> None:
    security = make_security()
    found = security.account_of(keys.pub("app"), None)
    assert not isinstance(found, Denial) and found.access_key == "app"
    (tmp_path / "acl.yml").write_text(acl_text(keys).replace("app\n", "app2\n").replace(
        keys.pub("app"), keys.pub("stranger")))
    assert security.acl is not None and security.acl.poll()
    found = security.account_of(keys.pub("app"), None)
    assert isinstance(found, Denial) and found.kind == "unknown_key"


def test_check_libzmq() -> None:
    check_libzmq((4, 3, 2), True)
    check_libzmq()  # this machine's
    with pytest.raises(ConfigError, match="older than 4.3.2.*CVE-2019-13132"):
        check_libzmq((4, 3, 1), True)
    with pytest.raises(ConfigError, match="without CURVE"):
        check_libzmq((4, 3, 5), False)


def test_start_refusals_name_the_key(tmp_path: Path, keys: Keys) -> None:
    acl = tmp_path / "acl.yml"
    acl.write_text(acl_text(keys))

    def cfg(**fields: Any) -> Any:
        base = {"aclEnable": True, "aclFile": str(acl),
                "curveSecretKeyFile": str(keys.secret("broker"))}
        return load_config(None, (), env={}, **{**base, **fields})

    with pytest.raises(ConfigError, match="curveSecretKeyFile"):
        load_config(None, (), env={}, aclEnable=True, aclFile=str(acl))
    os.chmod(keys.secret("admin"), 0o640)
    with pytest.raises(ConfigError, match="'curveSecretKeyFile'.*too open"):
        Security.from_config(cfg(curveSecretKeyFile=str(keys.secret("admin"))))
    with pytest.raises(ConfigError, match="'haMasterPublicKeyFile'"):
        Security.from_config(cfg(haMasterPublicKeyFile=str(tmp_path / "none.key")))
    (tmp_path / "bad.yml").write_text("accounts: [\n")
    with pytest.raises(ConfigError, match="'aclFile'.*not YAML"):
        Security.from_config(cfg(aclFile=str(tmp_path / "bad.yml")))
    assert not Security.from_config(load_config(None, (), env={})).enabled


# ---- reloads ----------------------------------------------------------------------------------


def test_reload_swaps_a_good_file_whole_and_keeps_the_old_on_a_bad_one(
        make_security: Callable[..., Security], keys: Keys, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    security = make_security()
    holder = security.acl
    assert holder is not None
    first = holder.current
    path = tmp_path / "acl.yml"
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, same bytes
    assert not holder.poll() and holder.current is first
    for bad in ("accounts: [\n", "", "accounts:\n  - accessKey: x\n"):
        path.write_text(bad)
        with caplog.at_level(logging.ERROR, logger="replog.security"):
            assert not holder.poll()
        assert holder.current is first and holder.failing
        assert security.status()["aclReloadFailing"]
    assert "event=acl_reload_failed" in caplog.text and "kept_version=1" in caplog.text
    assert holder.reloads["error"] == 3
    path.unlink()  # gone: kept too
    assert not holder.poll() and holder.current is first
    path.write_text(acl_text(keys, extra=f'  - accessKey: late\n    curvePublicKey: '
                                          f'"{keys.pub("stranger")}"\n'))
    assert holder.poll()
    assert holder.current.version == 2 and not holder.failing
    assert holder.current.account(keys.pub("stranger")) is not None
    assert first.account(keys.pub("stranger")) is None  # the old snapshot never changed


def test_the_thread_polls_reloads_on_request_and_stops(make_security: Callable[..., Security],
                                                       keys: Keys, tmp_path: Path) -> None:
    security = make_security(start=True, aclReloadIntervalMs=50)
    path = tmp_path / "acl.yml"
    path.write_text(acl_text(keys, extra="  - accessKey: x1\n    curvePublicKey: "
                                         f'"{keys.pub("stranger")}"\n'))
    wait_for(lambda: security.version == 2, "the poller to load version 2")
    slow = make_security(start=True, aclReloadIntervalMs=600_000)  # only SIGHUP reloads it
    path.write_text(acl_text(keys))
    slow.request_reload()
    wait_for(lambda: slow.version == 2, "request_reload (SIGHUP) to reload")
    thread = slow._thread
    slow.stop()
    assert thread is not None and not thread.is_alive()
    assert not any(t.name == "replog-security" and t is thread for t in threading.enumerate())


# ---- audit ------------------------------------------------------------------------------------


def test_audit_lines_are_rate_limited_per_key(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    audit = Audit(clock=lambda: now[0])
    denial = Denial("app", "PUB", "Topic:t", "topicPerms says DENY", "deny")
    with caplog.at_level(logging.INFO, logger="replog.audit"):
        for _ in range(20):
            audit.refused("client", "10.0.0.1", "KEY-A", denial, 3)
        audit.refused("client", "10.0.0.2", "KEY-B", denial, 3)  # another key: its own budget
        now[0] += 2.0  # two tokens back
        audit.refused("client", "10.0.0.1", "KEY-A", denial, 3)
    lines = [r.getMessage() for r in caplog.records if r.name == "replog.audit"]
    assert len(lines) == sec_mod.AUDIT_BURST + 2
    assert all("event=refused" in line and "account=app" in line and "op=PUB" in line
               and "resource=Topic:t" in line and "aclVersion=3" in line for line in lines)
    assert "ip=10.0.0.2" in lines[sec_mod.AUDIT_BURST]
    assert lines[-1].endswith(f"suppressed={20 - sec_mod.AUDIT_BURST}")
    assert audit.counts()[1][("client", "PUB", "deny")] == 22  # counted, every one


# ---- the ZAP handler ---------------------------------------------------------------------------


def test_the_zap_handler_refuses_other_mechanisms_and_survives_a_failing_check(
        ctx: zmq.Context[Any]) -> None:
    calls: list[tuple[str, str, str]] = []

    def admit(domain: str, key: str, address: str) -> tuple[bool, str]:
        calls.append((domain, key, address))
        if key == "0" * 40:
            raise RuntimeError("boom")
        return True, "OK"

    auth = sec_mod.ZapAuthenticator(ctx, admit)
    auth.start()
    req = bounded_socket(ctx, zmq.REQ)
    req.connect(sec_mod.ZAP_ENDPOINT)
    try:
        def ask(*frames: bytes) -> list[bytes]:
            req.send_multipart(list(frames))
            assert req.poll(3000)
            return req.recv_multipart()

        head = [b"1.0", b"7", CLIENT_DOMAIN.encode(), b"127.0.0.1", b""]
        assert ask(*head, b"PLAIN", b"u", b"p")[2:4] == [b"400", b"CURVE only"]
        assert ask(*head, b"NULL")[2] == b"400"
        assert ask(b"9.9", b"7", b"d", b"a", b"", b"CURVE", b"k" * 32)[2] == b"400"
        good = ask(*head, b"CURVE", b"\x01" * 32)
        assert good[2] == b"200" and good[4] == sec_mod.z85.encode(b"\x01" * 32)
        zero_key = b"\x00" * 32  # its Z85 is forty "0": admit raises
        assert ask(*head, b"CURVE", zero_key)[2] == b"500"
        assert auth.is_alive()
        assert ask(*head, b"CURVE", b"\x02" * 32)[2] == b"200"  # still serving
        assert calls[0] == (CLIENT_DOMAIN, sec_mod.z85.encode(b"\x01" * 32).decode(),
                            "127.0.0.1")
    finally:
        req.close(linger=0)
        auth.stop()


# ---- a whole broker, in this process ---------------------------------------------------------


def test_a_secure_broker_serves_and_stops_every_thread_it_started(
        make_broker: Callable[..., Any], keys: Keys, tmp_path: Path) -> None:
    from zmq.auth.thread import AuthenticationThread

    from common.client import Admin, Producer
    from common.core.errors import BrokerError, SendStatus

    before = set(threading.enumerate())
    acl = tmp_path / "acl.yml"
    acl.write_text(acl_text(keys))
    broker = make_broker(aclEnable=True, aclFile=str(acl), aclReloadIntervalMs=50,
                         curveSecretKeyFile=str(keys.secret("broker")))
    curve = {"key": str(keys.secret("app")), "server_key": str(keys.root / "broker.key")}
    address = f"127.0.0.1:{broker.cfg.listenPort}"
    with Producer([address], **curve) as p:
        assert p.send("t", b"hello").status == SendStatus.SEND_OK
    with Admin([address], **curve) as a, pytest.raises(BrokerError, match="NO_PERMISSION"):
        a.create_topic("x", 1)
    started = [t for t in set(threading.enumerate()) - before
               if isinstance(t, AuthenticationThread) or t.name == "replog-security"]
    assert len(started) == 3  # two ZAP threads (client port, HA port) and the ACL poller
    broker.shutdown()
    for t in started:
        t.join(DEADLINE_S)
        assert not t.is_alive(), t


def test_keys_and_acl_come_from_env_and_set_as_every_key(keys: Keys, tmp_path: Path) -> None:
    """What a container does: mount the files, set REPLOG_<key> (or --set)."""
    acl = tmp_path / "acl.yml"
    acl.write_text(acl_text(keys))
    env = {"REPLOG_aclEnable": "true", "REPLOG_aclFile": str(acl),
           "REPLOG_curveSecretKeyFile": str(keys.secret("broker")),
           "REPLOG_aclReloadIntervalMs": "1000",
           "REPLOG_KEY": "/not/a/config/key"}  # the CLI's, ignored by the broker
    cfg = load_config(None, [f"haMasterPublicKeyFile={keys.root / 'replica.key'}"], env=env)
    assert (cfg.aclEnable, cfg.aclFile, cfg.aclReloadIntervalMs) == (True, str(acl), 1000)
    security = Security.from_config(cfg)
    peer = security.peer_keys()
    assert peer is not None and peer.server_key == load_public(keys.root / "replica.key").public
    assert security.own is not None and security.own.public.decode() == keys.pub("broker")
    with pytest.raises(ConfigError, match="aclFile"):
        load_config(None, ["aclEnable=true", f"curveSecretKeyFile={keys.secret('broker')}"],
                    env={})
