"""The broker's security layer (``docs/security.md``): CURVE and ZAP on every port it binds,
the ACL in force and its reloads, the per-request identity, audit lines and counters.

Every server socket of a broker (the client ROUTER, ``common/broker/server.py``; the master's HA
ROUTER, ``master/ha_service.py``) is made by ``Security.server_socket`` and bound by
``Security.bind``; a ZooKeeper controller's sockets, or any other, should be too. With
``aclEnable`` that means:

* ``curve_server`` with this broker's key pair (``curveSecretKeyFile``), a ZAP domain per port
  (``replog.client``, ``replog.ha``) and ``ZMQ_HANDSHAKE_IVL`` (``curveHandshakeTimeoutMs``);
* ``bind`` refuses (``InsecureBindError``) unless a ZAP authenticator of ours is running in the
  socket's own Context: without a ZAP handler libzmq lets in any client that knows the server's
  public key (``ZAP_ENFORCE_DOMAIN`` is a draft option). The check asks libzmq too: the ZAP
  endpoint ``inproc://zeromq.zap.01`` must be taken in that Context;
* ``ZapAuthenticator`` (pyzmq's ``ThreadAuthenticator``, one per Context, started by the
  socket's owner before it binds and stopped before its Context ends) admits a CURVE key only
  when the current ACL holds it in an enabled account, from an allowed address, and, on the HA
  port, a ``replica`` account; anything else is answered 400 with the reason, and audited. The
  ZAP User-Id is the Z85 public key;
* per request, ``account_of(user_id, frame)`` maps that User-Id (from the frames, received with
  ``copy=False``) to its account in the ACL in force *now*, so a key revoked by a reload is
  refused on connections already open; a routing id is never an identity;
* a ``HandshakeMonitor`` on each server socket counts handshakes
  (``replog_handshake_total{port,result}``), including garbage and wrong-key attempts that
  never reach ZAP. The socket's owner polls it beside the socket, on the socket's own thread,
  and disables it before closing the socket: libzmq sends monitor events with a blocking send,
  so a monitor nobody reads any more stalls the Context's I/O thread, handshakes included.

One thread, "replog-security", polls the ACL file every ``aclReloadIntervalMs`` (stat, then
sha256: a touch changes nothing) and reloads it at once on ``request_reload`` (SIGHUP). A file
that does not parse is logged at ERROR and counted
(``replog_acl_reload_total{result="error"}``, ``replog_acl_reload_failing`` 1), and the
snapshot in force stays; a good one is swapped in whole (``AclSnapshot`` is immutable).

Refusals go to the logger ``replog.audit``, one line each, at most ``AUDIT_BURST`` per key and
then one a second (the next line says how many were left out), and to
``replog_authz_denied_total{port,op,reason}``.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from common.core.errors import ConfigError
from common.core.keys import (
    ClientKeys,
    KeyFileError,
    KeyPair,
    fingerprint,
    load_public,
    load_secret,
)
from common.core.logs import log_event
from common.format.acl import (
    MAX_ACL_BYTES,
    Account,
    AclError,
    AclSnapshot,
    Denial,
    parse_acl,
    perm_name,
    publisher_refusal,
    unknown_key,
)

log = logging.getLogger("replog.security")
audit_log = logging.getLogger("replog.audit")

CLIENT_DOMAIN = "replog.client"
HA_DOMAIN = "replog.ha"
PORT_OF_DOMAIN = {CLIENT_DOMAIN: "client", HA_DOMAIN: "ha"}
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
LIBZMQ_MIN = (4, 3, 2)  # CVE-2019-13132: a remote buffer overflow in CURVE before 4.3.2
AUDIT_BURST = 5  # refusal lines per key before the rate limit
AUDIT_PER_S = 1.0  # then this many a second per key
AUDIT_MAX_KEYS = 4096  # keys whose rate is tracked (the oldest is forgotten past that)
AUDIT_RECENT = 100  # refusal lines kept for GET_BROKER_CLUSTER_ACL_INFO
JOIN_TIMEOUT_S = 5.0
_HANDSHAKE_EVENTS: dict[int, str] = {
    int(zmq.EVENT_HANDSHAKE_SUCCEEDED): "ok",
    int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): "refused",  # ZAP said no
    int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): "protocol",  # garbage, a wrong server key, NULL
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): "failed",  # cut, timed out (handshake_ivl)
}
_MONITOR_EVENTS = int(zmq.EVENT_MONITOR_STOPPED)  # sent only when asked for
for _event in _HANDSHAKE_EVENTS:
    _MONITOR_EVENTS |= int(_event)


class InsecureBindError(RuntimeError):
    """A CURVE server socket asked to bind without a running ZAP authenticator in its Context:
    libzmq would then admit any client holding the server's public key. A bug, never served."""


def check_libzmq(version: tuple[int, int, int] | None = None,
                 has_curve: bool | None = None) -> None:
    """ConfigError unless libzmq has CURVE and is at least LIBZMQ_MIN (aclEnable needs both)."""
    version = tuple(zmq.zmq_version_info()) if version is None else version  # type: ignore[assignment]
    has_curve = zmq.has("curve") if has_curve is None else has_curve
    assert version is not None
    if not has_curve:
        raise ConfigError("config key 'aclEnable': this libzmq was built without CURVE "
                          "(zmq.has('curve') is false); install a pyzmq wheel with libsodium")
    if tuple(version) < LIBZMQ_MIN:
        have = ".".join(map(str, version))
        need = ".".join(map(str, LIBZMQ_MIN))
        raise ConfigError(f"config key 'aclEnable': libzmq {have} is older than {need} "
                          "(CVE-2019-13132 lets a remote peer overflow a CURVE buffer)")


# ---- the guard -------------------------------------------------------------------------------

_running_lock = threading.Lock()
_running: dict[int, ZapAuthenticator] = {}  # id(Context) -> its authenticator


def require_authenticator(ctx: zmq.Context[Any]) -> None:
    """InsecureBindError unless a ZapAuthenticator of ours runs in ``ctx`` and libzmq sees a
    ZAP handler bound there (a second check that owes nothing to our bookkeeping)."""
    with _running_lock:
        auth = _running.get(id(ctx))
    if auth is None or auth.context is not ctx or not auth.is_alive():
        raise InsecureBindError("refusing to bind a CURVE server socket: no ZAP authenticator "
                                "runs in its Context (without one libzmq admits any client "
                                "that knows the server's public key)")
    probe = ctx.socket(zmq.PAIR)
    try:
        probe.bind(ZAP_ENDPOINT)
    except zmq.ZMQError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        return  # taken: the handler is there
    else:
        probe.unbind(ZAP_ENDPOINT)  # at once (a close frees the endpoint later)
    finally:
        probe.close(linger=0)
    raise InsecureBindError("refusing to bind a CURVE server socket: nothing is bound at "
                            f"{ZAP_ENDPOINT} in its Context")


class ZapAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread for one Context, asking ``admit(domain, key, address)`` about every
    CURVE handshake (only CURVE: any other mechanism is refused). Never raises out of the
    handler: a ZAP thread that died would leave the Context with no handler at all."""

    def __init__(self, ctx: zmq.Context[Any],
                 admit: Callable[[str, str, str], tuple[bool, str]]):
        super().__init__(ctx, log=logging.getLogger("replog.zap"))
        self._admit = admit

    def start(self) -> None:
        super().start()
        with _running_lock:
            _running[id(self.context)] = self

    def stop(self) -> None:
        with _running_lock:
            if _running.get(id(self.context)) is self:
                del _running[id(self.context)]
        super().stop()

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        request_id = msg[1] if len(msg) > 1 else b""
        try:
            status, text, user = self._decide(msg)
        except Exception as e:  # answered 500; the thread must live
            self.log.exception("event=zap_handler_failed")
            status, text, user = b"500", f"internal error: {e!r}"[:200].encode(), b""
        self.zap_socket.send_multipart([ZAP_VERSION, request_id, status, text, user, b""])

    def _decide(self, msg: list[bytes]) -> tuple[bytes, bytes, bytes]:
        if len(msg) < 6 or msg[0] != ZAP_VERSION:
            return b"400", b"malformed ZAP request", b""
        _version, _request_id, domain, address, _identity, mechanism = msg[:6]
        credentials = msg[6:]
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            return b"400", b"CURVE only", b""
        key = z85.encode(credentials[0]).decode("ascii")
        ok, text = self._admit(domain.decode("utf-8", "replace"), key,
                               address.decode("utf-8", "replace"))
        if ok:
            return b"200", b"OK", key.encode("ascii")
        return b"400", text.encode("utf-8", "replace")[:255], b""


# ---- the ACL file in force -------------------------------------------------------------------


class AclHolder:
    """The current ``AclSnapshot`` and its reloads from ``path``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._lock = threading.Lock()  # one reload at a time (poller, SIGHUP, tests)
        self._stat: tuple[int, int, int] | None = None
        self._mode = 0
        self.current: AclSnapshot = self._load_first()
        self.reloads = collections.Counter[str]()
        self.failing = ""  # the last reload's error while the file stays bad

    def _load_first(self) -> AclSnapshot:
        try:
            data, stat = self._read()
            snapshot = self._parse(data, version=1)
        except (OSError, AclError) as e:
            raise ConfigError(f"config key 'aclFile': {e}") from None
        self._stat = stat
        return snapshot

    def _read(self) -> tuple[bytes, tuple[int, int, int]]:
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size > MAX_ACL_BYTES:
                raise AclError(f"{self.path}: {st.st_size} bytes, at most {MAX_ACL_BYTES}")
            data = f.read(MAX_ACL_BYTES + 1)
        self._mode = st.st_mode
        return data, (st.st_ctime_ns, st.st_size, st.st_ino)

    def _parse(self, data: bytes, version: int) -> AclSnapshot:
        """``parse_acl``, and a file holding secretKeys must be its owner's alone (as a
        ``.key_secret``): anyone who reads it could sign as those accounts."""
        snapshot = parse_acl(data, str(self.path), version)
        if snapshot.has_secrets and self._mode & 0o077:
            raise AclError(f"{self.path}: holds secretKeys, so group and others must not read "
                           f"it (mode {self._mode & 0o777:o}): chmod 600 {self.path}")
        return snapshot

    def poll(self, force: bool = False) -> bool:
        """Reload when the file changed (stat, then its sha256), or with ``force``; True when
        a new snapshot is in force. A bad file keeps the current one (logged, counted)."""
        with self._lock:
            try:
                st = os.stat(self.path)
                stat = (st.st_ctime_ns, st.st_size, st.st_ino)
                if stat == self._stat and not force:
                    return False
                data, stat = self._read()
                self._stat = stat
                if hashlib.sha256(data).hexdigest() == self.current.digest:
                    self._resolved()
                    return False
                snapshot = self._parse(data, self.current.version + 1)
            except (OSError, AclError) as e:
                self.reloads["error"] += 1
                why = str(e) if isinstance(e, AclError) else f"{self.path}: {e}"
                if why != self.failing:
                    log_event(log, "acl_reload_failed", logging.ERROR, file=str(self.path),
                              error=why, kept_version=self.current.version)
                self.failing = why
                return False
            self.current = snapshot
            self.reloads["ok"] += 1
            self.failing = ""
            log_event(log, "acl_reloaded", file=str(self.path), version=snapshot.version,
                      accounts=len(snapshot.accounts), sha256=snapshot.digest[:16])
            return True

    def _resolved(self) -> None:
        if self.failing:
            log_event(log, "acl_reload_recovered", file=str(self.path),
                      version=self.current.version)
            self.failing = ""


# ---- audit lines and counters ----------------------------------------------------------------


class Audit:
    """Refusal lines (rate-limited per key) and the security counters; any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: collections.OrderedDict[str, list[float]] = collections.OrderedDict()
        self.denied = collections.Counter[tuple[str, str, str]]()  # (port, op, reason kind)
        self.handshakes = collections.Counter[tuple[str, str]]()  # (port, result)
        self.lines = 0
        self.suppressed = 0
        # the last refusal lines, for admins (GET_BROKER_CLUSTER_ACL_INFO, the console)
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=AUDIT_RECENT)

    def refused(self, port: str, address: str, key: str, denial: Denial, version: int) -> None:
        with self._lock:
            self.denied[(port, denial.op, denial.kind)] += 1
            suppressed = self._take(key)
            if suppressed is None:
                self.suppressed += 1
                return
            self.lines += 1
            self.recent.append({"atMs": int(time.time() * 1000), "port": port,
                                "ip": address or "?", "account": denial.account,
                                "op": denial.op, "resource": denial.resource,
                                "reason": denial.reason, "suppressed": suppressed})
        log_event(audit_log, "refused", logging.INFO, port=port, ip=address or "?",
                  key=fingerprint(key) if key else "-", account=denial.account, op=denial.op,
                  resource=denial.resource, reason=denial.reason, reasonKind=denial.kind,
                  aclVersion=version, suppressed=suppressed)

    def _take(self, key: str) -> int | None:
        """A token of ``key``'s bucket: the count left out since its last line, or None."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= AUDIT_MAX_KEYS:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = [float(AUDIT_BURST), now, 0.0]
        tokens = min(float(AUDIT_BURST), bucket[0] + (now - bucket[1]) * AUDIT_PER_S)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            bucket[2] += 1
            return None
        bucket[0] = tokens - 1.0
        left_out, bucket[2] = int(bucket[2]), 0.0
        return left_out

    def handshake(self, port: str, result: str) -> None:
        with self._lock:
            self.handshakes[(port, result)] += 1

    def counts(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str, str], int]]:
        """Copies of (handshakes by (port, result), refusals by (port, op, reason kind))."""
        with self._lock:
            return dict(self.handshakes), dict(self.denied)


# ---- the layer -------------------------------------------------------------------------------


class HandshakeMonitor:
    """A server socket's handshake events, counted into ``audit`` (see the module docstring:
    read by the socket's owner, on its thread, until ``close``)."""

    def __init__(self, sock: zmq.Socket[Any], port: str, audit: Audit):
        self._target = sock
        self.port = port
        self._audit = audit
        self.socket: zmq.Socket[Any] | None = sock.get_monitor_socket(_MONITOR_EVENTS)

    def drain(self) -> None:
        """Count what the monitor holds (the owner calls it when ``socket`` is readable)."""
        sock = self.socket
        for _ in range(1024):
            if sock is None:
                return
            try:
                event = recv_monitor_message(sock, zmq.NOBLOCK)
            except zmq.Again:
                return
            result = _HANDSHAKE_EVENTS.get(int(event["event"]))
            if result is not None:
                self._audit.handshake(self.port, result)

    def close(self) -> None:
        """Before the socket closes: stop the events, then close the monitor."""
        if self.socket is None:
            return
        try:
            self._target.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket is closed already: so is its side of the monitor
        self.socket.close(linger=0)
        self.socket = None


class Security:
    """The broker's security settings and services (see the module docstring); with
    ``enabled`` False every socket is plain and nothing is checked."""

    def __init__(self, enabled: bool = False, own: KeyPair | None = None,
                 master_key: bytes | None = None, acl: AclHolder | None = None,
                 reload_interval_ms: int = 5000, handshake_timeout_ms: int = 5000):
        self.enabled = enabled
        self.own = own
        self._master_key = master_key
        self.acl = acl
        self.audit = Audit()
        self.reload_interval_s = reload_interval_ms / 1000.0
        self.handshake_timeout_ms = handshake_timeout_ms
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reload_now = threading.Event()
        self._wake_r = self._wake_w = -1

    @classmethod
    def from_config(cls, cfg: Any) -> Security:
        """The layer ``cfg`` asks for; ConfigError (nothing started) when aclEnable is on and
        libzmq, a key file or the ACL file cannot be used."""
        if not cfg.aclEnable:
            return cls()
        check_libzmq()
        try:
            own = load_secret(os.path.expanduser(cfg.curveSecretKeyFile))
        except KeyFileError as e:
            raise ConfigError(f"config key 'curveSecretKeyFile': {e}") from None
        master = own.public
        if cfg.haMasterPublicKeyFile:
            try:
                master = load_public(os.path.expanduser(cfg.haMasterPublicKeyFile)).public
            except KeyFileError as e:
                raise ConfigError(f"config key 'haMasterPublicKeyFile': {e}") from None
        acl = AclHolder(os.path.expanduser(cfg.aclFile))
        return cls(True, own, master, acl, cfg.aclReloadIntervalMs, cfg.curveHandshakeTimeoutMs)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="replog-security", daemon=True)
        self._thread.start()
        assert self.acl is not None
        log_event(log, "security_started", aclFile=str(self.acl.path),
                  aclVersion=self.acl.current.version, accounts=len(self.acl.current.accounts),
                  key=fingerprint(self.own.public) if self.own else "-")

    def stop(self) -> None:
        """Stop the thread (it holds no socket)."""
        if self._thread is None:
            return
        self._stop.set()
        self._poke()
        self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            log_event(log, "security_thread_stuck", logging.ERROR)
            return
        self._thread = None
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._wake_r = self._wake_w = -1

    def request_reload(self) -> None:
        """Reload the ACL file now (SIGHUP); safe in a signal handler."""
        if self.enabled:
            self._reload_now.set()
            self._poke()

    def _poke(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"\0")
            except (BlockingIOError, OSError):
                pass  # full: a wake-up is pending anyway

    # -- sockets ---------------------------------------------------------------------------------
    def start_authenticator(self, ctx: zmq.Context[Any]) -> ZapAuthenticator | None:
        """Start the ZAP handler of ``ctx`` (before anything in it binds); its owner stops it
        before the Context ends. None when security is off."""
        if not self.enabled:
            return None
        auth = ZapAuthenticator(ctx, self.admit)
        auth.start()
        return auth

    def server_socket(self, ctx: zmq.Context[Any], kind: int, domain: str) -> zmq.Socket[Any]:
        """A server socket of ``kind`` for the port of ``domain``: a CURVE server with that
        ZAP domain (and a handshake monitor) when enabled, else plain."""
        sock = ctx.socket(kind)
        if not self.enabled:
            return sock
        assert self.own is not None and self.own.secret is not None
        try:
            sock.curve_secretkey = self.own.secret
            sock.curve_publickey = self.own.public
            sock.curve_server = True
            sock.zap_domain = domain.encode("ascii")
            sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_timeout_ms)
        except BaseException:
            sock.close(linger=0)
            raise
        return sock

    def bind(self, sock: zmq.Socket[Any], endpoint: str) -> None:
        """Bind ``sock``; a CURVE server only when its Context's authenticator runs."""
        if sock.getsockopt(zmq.CURVE_SERVER):
            require_authenticator(sock.context)
        sock.bind(endpoint)

    def handshake_monitor(self, sock: zmq.Socket[Any], domain: str) -> HandshakeMonitor | None:
        """The handshake counter of a server socket (None when security is off); its owner
        polls ``.socket``, calls ``drain`` when it is readable and ``close`` before closing
        ``sock``."""
        if not self.enabled:
            return None
        return HandshakeMonitor(sock, PORT_OF_DOMAIN.get(domain, domain), self.audit)

    # -- keys for the broker's own connections ------------------------------------------------
    def peer_keys(self) -> ClientKeys | None:
        """This broker as a client of its group (HA client, config sync, group probes): its
        own key pair, pinning ``haMasterPublicKeyFile`` (or its own public key)."""
        if not self.enabled:
            return None
        assert self.own is not None and self.own.secret is not None
        return ClientKeys(self.own.public, self.own.secret, self._master_key)

    # -- decisions -----------------------------------------------------------------------------
    def admit(self, domain: str, key: str, address: str) -> tuple[bool, str]:
        """ZAP: may ``key`` from ``address`` complete a handshake on the port of ``domain``?"""
        assert self.acl is not None
        snapshot = self.acl.current
        port = PORT_OF_DOMAIN.get(domain)
        acct = snapshot.account(key)
        denial: Denial | None
        if port is None:
            denial = Denial("unknown", "CONNECT", "Cluster", f"unknown ZAP domain {domain!r}",
                            "domain")
        elif acct is None:
            denial = unknown_key(key)
        else:
            denial = acct.may_connect(address)
            if denial is None and port == "ha":
                denial = acct.may_replicate()
        if denial is None:
            return True, "OK"
        self.audit.refused(port or domain, address, key, denial, snapshot.version)
        return False, denial.reason

    def account_of(self, user_id: str, frame: zmq.Frame | None) -> Account | Denial:
        """The account of a request's ZAP User-Id in the ACL in force now (a revoked key is
        refused on open connections too), checked for enabled and address."""
        assert self.acl is not None
        acct = self.acl.current.by_key.get(user_id)
        if acct is None:
            return unknown_key(user_id)
        if acct.enabled and acct.addresses is None:
            return acct
        denial = acct.may_connect(peer_address(frame))
        return acct if denial is None else denial

    def publisher_refusal(self, user_id: str, topic: str) -> str | None:
        """Why the account of ``user_id`` (a connection's CURVE key), in the ACL in force now,
        may not be asked about, nor decide, a transaction of ``topic``
        (``acl.publisher_refusal``); None with the ACL off."""
        if not self.enabled or self.acl is None:
            return None
        acct = self.acl.current.by_key.get(user_id)
        if acct is None:
            return unknown_key(user_id).reason
        return publisher_refusal(acct, topic)

    def refused(self, port: str, user_id: str, frame: zmq.Frame | None, denial: Denial) -> str:
        """Audit a refusal; returns the remark the requester gets."""
        assert self.acl is not None
        address = peer_address(frame)
        self.audit.refused(port, address, user_id, denial, self.acl.current.version)
        return denial.remark(address)

    @property
    def version(self) -> int:
        return self.acl.current.version if self.acl is not None else 0

    # -- what status, metrics and admins see -------------------------------------------------
    def status(self) -> dict[str, Any]:
        if not self.enabled or self.acl is None:
            return {"aclEnable": False}
        return {"aclEnable": True, "aclVersion": self.acl.current.version,
                "aclReloadFailing": bool(self.acl.failing)}

    def acl_info(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_ACL_INFO (admin): the ACL in force, without keys."""
        if not self.enabled or self.acl is None:
            return {"aclEnable": False}
        snap = self.acl.current
        return {
            "aclEnable": True,
            "aclFile": str(self.acl.path),
            "aclVersion": snap.version,
            "sha256": snap.digest,
            "reloadError": self.acl.failing,
            "reloads": dict(self.acl.reloads),
            "refusals": [{"port": port, "op": op, "reason": kind, "count": n}
                         for (port, op, kind), n in sorted(self.audit.counts()[1].items())],
            "recentRefusals": list(self.audit.recent)[::-1],
            "accounts": [account_doc(a) for a in snap.accounts],
        }

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        assert self.acl is not None
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        next_poll = time.monotonic() + self.reload_interval_s
        while not self._stop.is_set():
            wait_ms = max(0, int((next_poll - time.monotonic()) * 1000) + 1)
            if poller.poll(wait_ms):
                _drain(self._wake_r)
            if self._reload_now.is_set():
                self._reload_now.clear()
                self._safe_poll(force=True)
            if time.monotonic() >= next_poll:
                self._safe_poll()
                next_poll = time.monotonic() + self.reload_interval_s

    def _safe_poll(self, force: bool = False) -> None:
        assert self.acl is not None
        try:
            self.acl.poll(force)
        except Exception:  # logged; the snapshot in force stays, the thread goes on
            log.exception("event=acl_poll_failed")


def peer_address(frame: zmq.Frame | None) -> str:
    """The peer's IP address from a received frame's metadata ("" when unknown)."""
    if frame is None:
        return ""
    try:
        return str(frame.get("Peer-Address"))
    except zmq.ZMQError:
        return ""


def user_id(frame: zmq.Frame) -> str:
    """The ZAP User-Id of the connection a frame came over ("" when there is none)."""
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:
        return ""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass


def account_doc(a: Account) -> dict[str, Any]:
    """An account as admins see it (GET_BROKER_CLUSTER_ACL_INFO, ``replog acl``, the console):
    its flags and permissions, a fingerprint of its CURVE key, whether it may sign gRPC calls;
    never a key or a secret."""
    return {"accessKey": a.access_key,
            "key": fingerprint(a.public_key) if a.public_key else "-",
            "grpc": a.secret_key is not None, "admin": a.admin, "replica": a.replica,
            "enabled": a.enabled, "unrestricted": a.unrestricted,
            "defaultTopicPerm": perm_name(a.default_topic),
            "defaultGroupPerm": perm_name(a.default_group),
            "topicPerms": {t: perm_name(p) for t, p in sorted(a.topics.items())},
            "groupPerms": {g: perm_name(p) for g, p in sorted(a.groups.items())},
            "whiteRemoteAddress": a.addresses.text if a.addresses is not None else ""}
