"""The console's HTTP server (stdlib ``ThreadingHTTPServer``, threads "replog-console-http"):
the pages (``static/``: HTML, JavaScript and CSS served from the package, nothing from a CDN)
and their JSON API.

Reading needs nothing; every change (``POST``) needs an admin session and its CSRF token:

* ``POST /api/login`` with the console's admin password (``--admin-password-file``; compared
  in constant time) opens a session: a random id in a cookie (``HttpOnly``,
  ``SameSite=Strict``) and a random CSRF token the page sends back in ``X-CSRF-Token``;
  a change without both, or from another ``Origin``, is refused 403 and changes nothing;
* with ``--acl-file`` (brokers that run with ``aclEnable``) the login is an account of that
  ACL instead: an enabled admin with a ``secretKey``, by its access key and secret key;
* without either the console is read-only (every change: 403, saying so).

Every change is logged (``event=console_action``: who, from where, what), and every refused
login (``event=console_login_refused``).

Bounds (``common/format/boundary.py`` holds the rules): a request whose ``Host`` is not a name
of the console (``localhost``, an IP literal, the ``--listen`` host, ``allowed_hosts``) is
refused 421, so a page of another site rebinding its name to this address reads nothing; a
change is checked for its session before its body is read, and a body whose length is missing,
not a number or past ``MAX_BODY`` is refused before any of it is read; each socket times out
after ``SOCKET_TIMEOUT_S`` of silence, and past ``max_connections`` open connections a new one
is answered 503 and closed (``event=console_connection_refused``, at most one line a second).

Every call to the cluster goes through one ``Admin`` client (its timeouts bound each) and the
collector (``collector.py``) reads the figures on its own thread: a page never waits on a
broker for longer than a request's timeout, and many open pages cost the brokers nothing more.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from common.console.actions import ActionError, Actions
from common.console.collector import Collector
from common.core.logs import log_event
from common.format.acl import AclSnapshot
from common.format.boundary import content_length_refusal, host_name, host_refusal

log = logging.getLogger("replog.console")

SESSION_COOKIE = "replog_session"
SESSION_TTL_S = 8 * 3600
MAX_BODY = 64 * 1024
SOCKET_TIMEOUT_S = 10.0  # a connection silent this long (mid-request or idle) is closed
MAX_CONNECTIONS = 64  # connections served at once (a browser opens about 6 per page)
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/app.css": ("app.css", "text/css; charset=utf-8")}


class Sessions:
    """Admin sessions: id -> (CSRF token, who, expiry). A login is the console's admin
    password, or (``acl``: the brokers' ACL in force) an account of it that is an enabled
    admin with a ``secretKey``, its access key and secret key (compared in constant time)."""

    def __init__(self, password: str | None, acl: Callable[[], AclSnapshot] | None = None):
        self.password = password
        self.acl = acl
        self._lock = threading.Lock()
        self._by_id: dict[str, tuple[str, str, float]] = {}

    @property
    def writable(self) -> bool:
        return self.password is not None or self.acl is not None

    @property
    def mode(self) -> str:
        return "acl" if self.acl is not None else "password" if self.password else "none"

    def login(self, password: str, account: str = "") -> tuple[str, str] | None:
        who = self._check(password, account)
        if who is None:
            return None
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._by_id = {k: v for k, v in self._by_id.items() if v[2] > now}
            self._by_id[sid] = (csrf, who, now + SESSION_TTL_S)
        return sid, csrf

    def _check(self, password: str, account: str) -> str | None:
        if self.acl is not None:
            acct = self.acl().by_access_key.get(account)
            secret = acct.secret_key if acct is not None else None
            ok = hmac.compare_digest(password.encode(), (secret or "\0").encode())
            if acct is None or secret is None or not ok or not acct.enabled or not acct.admin:
                return None
            return account
        if self.password is None or not hmac.compare_digest(password.encode(),
                                                            self.password.encode()):
            return None
        return "admin"

    def _entry(self, sid: str | None) -> tuple[str, str, float] | None:
        if not sid:
            return None
        with self._lock:
            entry = self._by_id.get(sid)
        if entry is None or entry[2] < time.monotonic():
            return None
        return entry

    def csrf_of(self, sid: str | None) -> str | None:
        entry = self._entry(sid)
        return entry[0] if entry else None

    def who(self, sid: str | None) -> str:
        entry = self._entry(sid)
        return entry[1] if entry else ""

    def logout(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


class _Server(ThreadingHTTPServer):
    """A thread a connection, at most ``max_connections`` at once: one more is answered 503
    and closed at once, before a thread is made for it."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int):
        self.max_connections = max_connections
        self.open_connections = 0
        self.refused_connections = 0
        self._count_lock = threading.Lock()
        self._logged_at = float("-inf")
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count_lock:
            full = self.open_connections >= self.max_connections
            if not full:
                self.open_connections += 1
        if not full:
            super().process_request(request, client_address)
            return
        self.refused_connections += 1
        if time.monotonic() - self._logged_at >= 1.0:  # one line a second under a flood
            self._logged_at = time.monotonic()
            log_event(log, "console_connection_refused", logging.WARNING,
                      ip=client_address[0], open=self.open_connections,
                      refused=self.refused_connections)
        try:
            request.settimeout(0)
            request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.open_connections -= 1


class Console:
    """The server, its collector and its actions; ``start`` binds, ``stop`` ends all three.
    ``allowed_hosts``: names (besides localhost, IP literals and ``host``) that a request's
    ``Host`` may give: the names operators reach the console by."""

    def __init__(self, collector: Collector, actions: Actions, host: str, port: int,
                 password: str | None = None, acl: Callable[[], AclSnapshot] | None = None,
                 allowed_hosts: Iterable[str] = (), max_connections: int = MAX_CONNECTIONS):
        self.collector, self.actions = collector, actions
        self.sessions = Sessions(password, acl)
        self.host_names = LOCAL_NAMES | {host_name(h) for h in (host, *allowed_hosts) if h}
        console = self

        class Handler(_Handler):
            owner = console

        self.httpd = _Server((host, port), Handler, max_connections)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> None:
        self.collector.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="replog-console-http",
                                        daemon=True)
        self._thread.start()
        log_event(log, "console_listening", address=self.address,
                  writable=self.sessions.writable)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self.collector.stop()


class _Handler(BaseHTTPRequestHandler):
    owner: Console
    server_version = "replog-console"
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S  # StreamRequestHandler sets it on the socket

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _misdirected(self) -> bool:
        """Answer 421 (and True) when the request's Host is not a name of this console."""
        why = host_refusal(self.headers.get("Host"), self.owner.host_names)
        if why is None:
            return False
        log_event(log, "console_host_refused", logging.WARNING, ip=self.client_address[0],
                  host=str(self.headers.get("Host", ""))[:64])
        self.close_connection = True  # a body it sent stays unread
        self._json({"error": why}, HTTPStatus.MISDIRECTED_REQUEST)
        return True

    # ---- GET ------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self._misdirected():
            return
        url = urlsplit(self.path)
        if url.path in STATIC:
            name, kind = STATIC[url.path]
            data = resources.files("common.console").joinpath("static", name).read_bytes()
            return self._send(HTTPStatus.OK, data, kind)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        console = self.owner
        try:
            if url.path == "/api/cluster":
                return self._json(console.collector.view())
            if url.path == "/api/history":
                return self._json(console.collector.series())
            if url.path == "/api/consumer-history":
                return self._json(console.collector.consumer_series())
            if url.path == "/api/session":
                csrf = console.sessions.csrf_of(self._sid())
                return self._json({"writable": console.sessions.writable,
                                   "admin": csrf is not None, "csrf": csrf or "",
                                   "login": console.sessions.mode,
                                   "who": console.sessions.who(self._sid())})
            if url.path == "/api/topics":
                return self._json(console.actions.topics())
            if url.path == "/api/messages":
                return self._json(console.actions.find(query))
            if url.path == "/api/topic":
                return self._json(console.actions.topic(query))
            if url.path == "/api/groups":
                return self._json(console.actions.groups())
            if url.path == "/api/dlq":
                return self._json(console.actions.dead_letters(query))
            if url.path == "/api/acl":
                return self._json(console.actions.acl())
        except ActionError as e:
            return self._json({"error": str(e)}, e.status)
        return self._json({"error": f"no such page: {url.path}"}, HTTPStatus.NOT_FOUND)

    # ---- POST -----------------------------------------------------------------------------------
    def do_POST(self) -> None:
        if self._misdirected():
            return
        url = urlsplit(self.path)
        console = self.owner
        if url.path != "/api/login":  # no session, no body read
            refusal = self._refusal()
            if refusal:
                self.close_connection = True
                return self._json({"error": refusal}, HTTPStatus.FORBIDDEN)
        try:
            body = self._body()
        except _BodyRefused as e:
            self.close_connection = True  # what it sent is not read: the stream is lost
            return self._json({"error": str(e)}, e.status)
        if url.path == "/api/login":
            opened = console.sessions.login(str(body.get("password", "")),
                                            str(body.get("account", "")))
            if opened is None:
                why = ("this console is read-only (started without --admin-password-file or "
                       "--acl-file)" if not console.sessions.writable else
                       "not an enabled admin account with that secret key"
                       if console.sessions.mode == "acl" else "wrong password")
                log_event(log, "console_login_refused", logging.WARNING,
                          ip=self.client_address[0], account=str(body.get("account", ""))[:64])
                return self._json({"error": why}, HTTPStatus.FORBIDDEN)
            sid, csrf = opened
            cookie = (f"{SESSION_COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/; "
                      f"Max-Age={SESSION_TTL_S}")
            return self._json({"admin": True, "csrf": csrf}, headers={"Set-Cookie": cookie})
        try:
            if url.path == "/api/logout":
                console.sessions.logout(self._sid())
                return self._json({"admin": False})
            if url.path == "/api/topics":
                result = console.actions.create_topic(body)
            elif url.path == "/api/send":
                result = console.actions.send(body)
            elif url.path == "/api/groups/reset":
                result = console.actions.reset_offsets(body)
            elif url.path == "/api/dlq/resend":
                result = console.actions.resend_dead_letters(body)
            elif url.path == "/api/switchover":
                result = console.actions.switchover({**body,
                                                     "_cluster": console.collector.view()})
            else:
                return self._json({"error": f"no such action: {url.path}"},
                                  HTTPStatus.NOT_FOUND)
        except ActionError as e:
            return self._json({"error": str(e)}, e.status)
        # every change, who made it and what (the audit trail of the console)
        log_event(log, "console_action", who=console.sessions.who(self._sid()),
                  ip=self.client_address[0], action=url.path,
                  detail=json.dumps({k: v for k, v in body.items() if k != "body"})[:300])
        console.collector.refresh_now()
        return self._json(result)

    def _refusal(self) -> str:
        """Why a change is refused ("" when it may go on): an admin session, its CSRF token,
        and no foreign Origin."""
        sessions = self.owner.sessions
        if not sessions.writable:
            return ("this console is read-only (started without --admin-password-file or "
                    "--acl-file)")
        csrf = sessions.csrf_of(self._sid())
        if csrf is None:
            return "log in as the console's admin first"
        given = self.headers.get("X-CSRF-Token", "")
        if not hmac.compare_digest(given.encode(), csrf.encode()):
            return "missing or wrong CSRF token"
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != self.headers.get("Host", ""):
            return f"a change from another origin ({origin}) is refused"
        return ""

    # ---- helpers ------------------------------------------------------------------------------
    def _sid(self) -> str | None:
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == SESSION_COOKIE:
                return value
        return None

    def _body(self) -> dict[str, Any]:
        """The JSON object of the body, its length checked before any of it is read."""
        if self.headers.get("Transfer-Encoding") is not None:
            raise _BodyRefused(HTTPStatus.LENGTH_REQUIRED, "a body must come with a "
                               "Content-Length, not a Transfer-Encoding")
        declared = self.headers.get("Content-Length")
        why = content_length_refusal(declared, MAX_BODY)
        if why is not None:
            status = (HTTPStatus.LENGTH_REQUIRED if declared is None
                      else HTTPStatus.REQUEST_ENTITY_TOO_LARGE if declared.strip().isdigit()
                      else HTTPStatus.BAD_REQUEST)
            raise _BodyRefused(status, why)
        assert declared is not None
        length = int(declared)
        raw = self.rfile.read(length) if length else b"{}"
        if len(raw) < length:
            raise _BodyRefused(HTTPStatus.BAD_REQUEST, f"the body ended after {len(raw)} of "
                               f"{length} bytes")
        try:
            doc = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise _BodyRefused(HTTPStatus.BAD_REQUEST, f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise _BodyRefused(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return doc

    def _json(self, doc: Any, status: int = HTTPStatus.OK,
              headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(doc, default=str).encode(), "application/json",
                   headers)

    def _send(self, status: int, data: bytes, kind: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", "default-src 'self'")
        if self.close_connection:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


class _BodyRefused(Exception):
    """A request body not read: the status and why."""

    def __init__(self, status: HTTPStatus, why: str):
        super().__init__(why)
        self.status = status
