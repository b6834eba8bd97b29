"""The console's HTTP server (stdlib ``ThreadingHTTPServer``, threads "replog-console-http"):
the pages (``static/``: HTML, JavaScript and CSS served from the package, nothing from a CDN)
and their JSON API.

Reading needs nothing; every change (``POST``) needs an admin session and its CSRF token:

* ``POST /api/login`` with the console's admin password (``--admin-password-file``; compared
  in constant time) opens a session: a random id in a cookie (``HttpOnly``,
  ``SameSite=Strict``) and a random CSRF token the page sends back in ``X-CSRF-Token``;
  a change without both, or from another ``Origin``, is refused 403 and changes nothing;
* without a password file the console is read-only (every change: 403, saying so).

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
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from common.console.actions import ActionError, Actions
from common.console.collector import Collector
from common.core.logs import log_event

log = logging.getLogger("replog.console")

SESSION_COOKIE = "replog_session"
SESSION_TTL_S = 8 * 3600
MAX_BODY = 64 * 1024
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/app.css": ("app.css", "text/css; charset=utf-8")}


class Sessions:
    """Admin sessions: id -> (CSRF token, expiry)."""

    def __init__(self, password: str | None):
        self.password = password
        self._lock = threading.Lock()
        self._by_id: dict[str, tuple[str, float]] = {}

    @property
    def writable(self) -> bool:
        return self.password is not None

    def login(self, password: str) -> tuple[str, str] | None:
        if self.password is None or not hmac.compare_digest(password.encode(),
                                                            self.password.encode()):
            return None
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._by_id = {k: v for k, v in self._by_id.items() if v[1] > now}
            self._by_id[sid] = (csrf, now + SESSION_TTL_S)
        return sid, csrf

    def csrf_of(self, sid: str | None) -> str | None:
        if not sid:
            return None
        with self._lock:
            entry = self._by_id.get(sid)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def logout(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


class Console:
    """The server, its collector and its actions; ``start`` binds, ``stop`` ends all three."""

    def __init__(self, collector: Collector, actions: Actions, host: str, port: int,
                 password: str | None = None):
        self.collector, self.actions = collector, actions
        self.sessions = Sessions(password)
        console = self

        class Handler(_Handler):
            owner = console

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
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

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # ---- GET ------------------------------------------------------------------------------------
    def do_GET(self) -> None:
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
            if url.path == "/api/session":
                csrf = console.sessions.csrf_of(self._sid())
                return self._json({"writable": console.sessions.writable,
                                   "admin": csrf is not None, "csrf": csrf or ""})
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
        url = urlsplit(self.path)
        console = self.owner
        try:
            body = self._body()
        except ValueError as e:
            return self._json({"error": str(e)}, HTTPStatus.BAD_REQUEST)
        if url.path == "/api/login":
            opened = console.sessions.login(str(body.get("password", "")))
            if opened is None:
                why = ("this console is read-only (started without --admin-password-file)"
                       if not console.sessions.writable else "wrong password")
                return self._json({"error": why}, HTTPStatus.FORBIDDEN)
            sid, csrf = opened
            cookie = (f"{SESSION_COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/; "
                      f"Max-Age={SESSION_TTL_S}")
            return self._json({"admin": True, "csrf": csrf}, headers={"Set-Cookie": cookie})
        refusal = self._refusal()
        if refusal:
            return self._json({"error": refusal}, HTTPStatus.FORBIDDEN)
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
        console.collector.refresh_now()
        return self._json(result)

    def _refusal(self) -> str:
        """Why a change is refused ("" when it may go on): an admin session, its CSRF token,
        and no foreign Origin."""
        sessions = self.owner.sessions
        if not sessions.writable:
            return "this console is read-only (started without --admin-password-file)"
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
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError(f"a body of {length} bytes: at most {MAX_BODY}")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            doc = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError("the body must be a JSON object")  # noqa: TRY004 - a 400, as the others
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
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
