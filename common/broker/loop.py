"""Loop participants: components with ZeroMQ sockets but no thread, driven by a host's loop.

A participant (the master's HA service, ``master/ha_service.py``) owns sockets; a *host* polls
them beside its own and calls the participant, always on the host's one thread:

    bind(wake)            once, when the host takes it over; afterwards any thread may call
                          ``wake()`` and the host runs ``after_burst`` soon (wakes coalesce)
    poll_items()          before each poll: ``[(socket, zmq.POLLIN | maybe zmq.POLLOUT)]``
    on_events(sock, ev)   one of its sockets is ready (``ev``: the poll's event bits)
    after_burst()         the host's own work may have appended to the log (the request
                          server calls it after every burst of client requests), or a
                          ``wake()`` came
    timeout_ms()          before each poll: the longest the host may sleep (None: no limit)
    on_timer()            that time has passed
    close()               detached or the host's loop ends: close the sockets (host thread)

    reopen()              optional: after a failure, make the sockets anew (the host then
                          binds it again); raising means "try again later"

Hosts: the request server's I/O thread (``common.broker.server.RequestServer.attach``/``detach``,
through ``Participants``), so a participant's sockets are served with no thread hand-off at
all, or, without a request server, a ``ParticipantThread`` of its own. ``LoopHost.detach``
returns once ``close`` ran.

A participant that raises is never dropped silently: it is logged at ERROR
(``event=participant_failed``), closed, and counted in its ``ParticipantHealth`` (state,
failures, restarts, last error: ``status.health`` and the ``replog_component_*`` metrics).
One with ``reopen`` (the master's HA service) is then restarted after a back-off
(``RESTART_BACKOFF_S``, doubling up to ``RESTART_BACKOFF_MAX_S``; back to the first once it
has run ``HEALTHY_AFTER_S`` without failing, so a participant that fails right after each
restart is retried every 5 s, not in a loop), as RocketMQ's HA service restarts its
connections; the host goes on meanwhile. One without ``reopen`` stays dropped and shows
``failed``. A detach cancels a pending restart.

``Participants`` is the bookkeeping a host thread with a mailbox needs: ``attach``/``detach``
from any thread post ``_Attach``/``_Detach`` items (a participant's ``wake`` posts ``_Poke``)
that the host hands back to ``handle`` on its thread; the host calls ``begin`` when its loop
starts, ``prepare`` before each poll, ``on_events``/``after_burst``/``on_timers`` after it and
``end`` when its loop ends (every participant still attached is closed then).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq

log = logging.getLogger("replog.loop")

MAX_POLL_MS = 1000  # a ParticipantThread's longest sleep without a timeout
RESTART_BACKOFF_S = 0.1  # first wait before a failed participant is reopened
RESTART_BACKOFF_MAX_S = 5.0
HEALTHY_AFTER_S = 30.0  # running this long since its last (re)start resets the back-off


class LoopParticipant(Protocol):
    """Something a host's loop drives (see the module docstring); every call on one thread."""

    def bind(self, wake: Callable[[], None]) -> None: ...

    def poll_items(self) -> Sequence[tuple[zmq.Socket[Any], int]]: ...

    def on_events(self, sock: zmq.Socket[Any], events: int) -> None: ...

    def after_burst(self) -> None: ...

    def timeout_ms(self) -> int | None: ...

    def on_timer(self) -> None: ...

    def close(self) -> None: ...


class LoopHost(Protocol):
    """Where a participant runs. ``attach``/``detach`` may be called from any thread."""

    def attach(self, participant: LoopParticipant) -> None: ...

    def detach(self, participant: LoopParticipant, timeout_s: float) -> bool: ...  # closed?


def participant_name(participant: object) -> str:
    """How status and metrics name a participant: its ``name``, else its class name."""
    name = getattr(participant, "name", None)
    return name if isinstance(name, str) and name else type(participant).__name__


@dataclasses.dataclass
class ParticipantHealth:
    """What ``status.health`` shows of a participant (or a thread that restarts itself)."""

    state: str = "running"  # running | restarting | failed
    failures: int = 0
    restarts: int = 0
    lastError: str = ""  # the status document's spelling
    backoff_s: float = dataclasses.field(default_factory=lambda: RESTART_BACKOFF_S)
    up_since: float = dataclasses.field(default_factory=time.monotonic)

    def failed(self, error: BaseException, restarting: bool) -> float:
        """Count a failure; returns how long to wait before the restart."""
        if time.monotonic() - self.up_since >= HEALTHY_AFTER_S:
            self.backoff_s = RESTART_BACKOFF_S  # it ran well for a while: start over
        self.failures += 1
        self.lastError = f"{type(error).__name__}: {error}"[:500]
        self.state = "restarting" if restarting else "failed"
        wait = self.backoff_s
        self.backoff_s = min(RESTART_BACKOFF_MAX_S, self.backoff_s * 2)
        return wait

    def restarted(self) -> None:
        self.restarts += 1
        self.state = "running"
        self.up_since = time.monotonic()

    def as_status(self) -> dict[str, Any]:
        return {"state": self.state, "failures": self.failures, "restarts": self.restarts,
                "lastError": self.lastError}


@dataclasses.dataclass(eq=False)
class _Attachment:
    """A participant and what its host thread keeps about it."""

    participant: LoopParticipant
    closed: threading.Event = dataclasses.field(default_factory=threading.Event)
    active: bool = False  # taken over by the host thread (bound), not closed yet
    dead: bool = False  # detached before the host thread ever ran: never to be taken over
    armed: bool = False  # a wake is posted and its after_burst has not run yet
    due: float = float("inf")  # monotonic time of its on_timer
    polled: dict[Any, int] = dataclasses.field(default_factory=dict)  # socket -> poll flags
    restart_at: float = float("inf")  # failed, closed, to be reopened then (host thread)
    health: ParticipantHealth = dataclasses.field(default_factory=ParticipantHealth)


@dataclasses.dataclass(frozen=True)
class _Attach:
    att: _Attachment


@dataclasses.dataclass(frozen=True)
class _Detach:
    att: _Attachment


@dataclasses.dataclass(frozen=True)
class _Poke:
    att: _Attachment


class Participants:
    """The participants one host thread drives (see the module docstring).

    ``post(item)`` hands an item to the host thread (its mailbox); any thread may call it."""

    def __init__(self, post: Callable[[Any], None]):
        self._post = post
        self._lock = threading.Lock()
        self._registry: dict[LoopParticipant, _Attachment] = {}  # under _lock
        self._failed: dict[str, ParticipantHealth] = {}  # under _lock: dropped after failing
        self._started = False  # under _lock: the host thread has begun (or ended)
        self._over = False  # under _lock: the host's loop ended, no more attachments
        self._active: list[_Attachment] = []  # host thread only, like the four below
        self._waiting_restart = 0  # failed attachments waiting for their reopen
        self._by_sock: dict[Any, _Attachment] = {}
        # what the host's loop asks every turn, kept as plain attributes (``_recount``: a
        # property is a Python-level call, and these are read a few times a request)
        self.active = False  # a participant is attached and active
        self.polled = False  # a participant has sockets in the poll
        self.restarting = False  # a failed participant waits for its restart: the host
        # must call ``prepare`` and ``on_timers`` although no participant is active
        self._poller: zmq.Poller | None = None
        self._ident = 0

    # ---- any thread --------------------------------------------------------------------------
    def attach(self, participant: LoopParticipant) -> None:
        with self._lock:
            if self._over:
                raise RuntimeError("the host's loop has ended: nothing to attach to")
            if participant in self._registry:
                return
            att = _Attachment(participant)
            self._registry[participant] = att
        if threading.get_ident() == self._ident:
            self._activate(att)
        else:
            self._post(_Attach(att))

    def detach(self, participant: LoopParticipant, timeout_s: float) -> bool:
        with self._lock:
            att = self._registry.get(participant)
            if att is None:
                return True
            idle = not self._started  # no host thread yet: none will ever touch it
            if idle:
                att.dead = True
                del self._registry[participant]
            over = self._over
        if idle:
            _close(att)
            return True
        if threading.get_ident() == self._ident:
            self._deactivate(att)
            return True
        if not over:
            self._post(_Detach(att))
        return att.closed.wait(timeout_s)

    def __contains__(self, participant: LoopParticipant) -> bool:
        """Attached and not closed yet."""
        with self._lock:
            return participant in self._registry

    def __len__(self) -> int:
        with self._lock:
            return len(self._registry)

    def health(self) -> dict[str, dict[str, Any]]:
        """Name -> health of every participant attached, and of those dropped after failing."""
        with self._lock:
            out = {name: h.as_status() for name, h in self._failed.items()}
            for participant, att in self._registry.items():
                out[participant_name(participant)] = att.health.as_status()
        return out

    # ---- the host thread ---------------------------------------------------------------------
    def _recount(self) -> None:
        """After any change to ``_active``, ``_by_sock`` or ``_waiting_restart``."""
        self.active = bool(self._active)
        self.polled = bool(self._by_sock)
        self.restarting = self._waiting_restart > 0

    def begin(self, poller: zmq.Poller) -> None:
        self._ident = threading.get_ident()
        self._poller = poller
        with self._lock:
            self._started = True

    def handle(self, item: Any) -> bool:
        """A mailbox item of ours? Then it is carried out here."""
        if isinstance(item, _Poke):
            item.att.armed = False  # before it runs: a later wake posts again
            if item.att.active:
                self._call(item.att, item.att.participant.after_burst)
        elif isinstance(item, _Attach):
            self._activate(item.att)
        elif isinstance(item, _Detach):
            self._deactivate(item.att)
        else:
            return False
        return True

    def prepare(self, poller: zmq.Poller, now: float) -> int | None:
        """Before the poll: register the sockets as asked, return the shortest timeout (ms)."""
        timeout: int | None = None
        for att in self._restarting() if self._waiting_restart else ():
            restart_ms = max(0, int((att.restart_at - now) * 1000) + 1)
            timeout = restart_ms if timeout is None else min(timeout, restart_ms)
        for att in tuple(self._active):
            participant = att.participant
            try:  # inline, not by _call: this runs every turn
                items = participant.poll_items()
                wait_ms = participant.timeout_ms()
            except Exception as e:  # noqa: BLE001 - logged there; the host must keep serving
                self._failed_call(att, e)
                continue
            for s, flags in items:
                if att.polled.get(s) != flags:
                    poller.register(s, flags)
                    att.polled[s] = flags
                    self._by_sock[s] = att
                    self.polled = True
            if wait_ms is None:
                att.due = float("inf")
            else:
                att.due = now + wait_ms / 1000
                timeout = wait_ms if timeout is None else min(timeout, wait_ms)
        return timeout

    def on_events(self, events: dict[Any, int]) -> None:
        for s, ev in events.items():
            att = self._by_sock.get(s)
            if att is not None and att.active:
                self._call(att, att.participant.on_events, s, ev)

    def after_burst(self) -> None:
        for att in tuple(self._active):
            try:  # inline, not by _call: this runs every burst
                att.participant.after_burst()
            except Exception as e:  # noqa: BLE001 - logged there; the host must keep serving
                self._failed_call(att, e)

    def on_timers(self, now: float) -> None:
        for att in tuple(self._active):
            if now >= att.due and att.active:
                att.due = float("inf")
                self._call(att, att.participant.on_timer)
        for att in self._restarting() if self._waiting_restart else ():
            if now >= att.restart_at:
                self._restart(att)

    def _restarting(self) -> list[_Attachment]:
        with self._lock:
            return [a for a in self._registry.values() if a.restart_at != float("inf")]

    def _restart(self, att: _Attachment) -> None:
        """Reopen a failed participant and take it over again; another back-off if that
        fails too."""
        att.restart_at = float("inf")
        self._waiting_restart -= 1
        self._recount()
        name = participant_name(att.participant)
        try:
            att.participant.reopen()  # type: ignore[attr-defined]
        except Exception as e:
            with self._lock:
                wait = att.health.failed(e, restarting=True)
            att.restart_at = time.monotonic() + wait
            self._waiting_restart += 1
            self._recount()
            log.exception("event=participant_restart_failed participant=%s retry_in_s=%.1f",
                          name, wait)
            return
        with self._lock:
            att.health.restarted()
        log.warning("event=participant_restarted participant=%s restarts=%d", name,
                    att.health.restarts)
        self._activate(att)

    def end(self) -> None:
        """The host's loop ends: close every participant still attached."""
        with self._lock:
            self._over = self._started = True
            atts = list(self._registry.values())
        for att in atts:
            self._deactivate(att)

    def _activate(self, att: _Attachment) -> None:
        if att.active or att.dead or att.closed.is_set():
            return  # detached before its attach item was read
        att.active = True
        self._active.append(att)
        self._recount()
        self._call(att, att.participant.bind, functools.partial(self._wake, att))

    def _wake(self, att: _Attachment) -> None:
        """Any thread: have the host thread run ``after_burst`` soon (coalesced)."""
        if att.armed:
            return
        att.armed = True
        try:
            self._post(_Poke(att))
        except Exception:  # noqa: BLE001 - a full mailbox (a bug guard): a later pass catches up
            att.armed = False

    def _unhook(self, att: _Attachment) -> None:
        """Stop polling and calling ``att`` (host thread)."""
        if att.active:
            att.active = False
            self._active.remove(att)
            for s in att.polled:
                self._by_sock.pop(s, None)
                if self._poller is not None:
                    self._poller.unregister(s)
            att.polled.clear()
            self._recount()

    def _deactivate(self, att: _Attachment) -> None:
        if att.closed.is_set():
            return
        self._unhook(att)
        if att.restart_at != float("inf"):  # closed when it failed: its restart is cancelled
            att.restart_at = float("inf")
            self._waiting_restart -= 1
            self._recount()
            att.closed.set()
        else:
            _close(att)
        with self._lock:
            self._registry.pop(att.participant, None)

    def _call(self, att: _Attachment, fn: Callable[..., Any], *args: Any) -> Any:
        """Call into a participant; one that raises is logged, closed and then restarted
        (``reopen``) or dropped (without one)."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - logged there; the host must keep serving
            self._failed_call(att, e)
            return None

    def _failed_call(self, att: _Attachment, error: Exception) -> None:
        name = participant_name(att.participant)
        can_restart = callable(getattr(att.participant, "reopen", None))
        with self._lock:
            can_restart = can_restart and not self._over
            wait = att.health.failed(error, restarting=can_restart)
        log.error("event=participant_failed participant=%s error=%r action=%s", name,
                  str(error), f"restart_in_{wait:.1f}s" if can_restart else "dropped",
                  exc_info=error)
        if not can_restart:
            with self._lock:
                self._failed[name] = att.health
            self._deactivate(att)
            return
        self._unhook(att)
        try:
            att.participant.close()
        except Exception:  # logged; it is reopened either way
            log.exception("event=participant_close_failed participant=%s", name)
        att.restart_at = time.monotonic() + wait
        self._waiting_restart += 1
        self._recount()


def _close(att: _Attachment) -> None:
    try:
        att.participant.close()
    except Exception:  # logged; it is dropped either way
        log.exception("event=participant_close_failed")
    att.closed.set()


class ParticipantThread:
    """A host of one participant on a thread of its own (a participant without a server).

    The thread polls the participant's sockets and a self-pipe that ``wake`` writes; it runs
    ``after_burst`` after a wake, ``on_events`` for ready sockets and ``on_timer`` when the
    participant's timeout passed. ``detach`` stops it; the participant is closed on the
    thread before it ends. A participant that raises is logged, closed and, with ``reopen``,
    restarted on the same thread after a back-off (as ``Participants`` does)."""

    def __init__(self, name: str):
        self._name = name
        self._health = ParticipantHealth()
        self._health_lock = threading.Lock()
        self._participant: LoopParticipant | None = None
        self._thread: threading.Thread | None = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._pipe_lock = threading.Lock()  # the write end is never used after it is closed
        self._armed = False
        self._stopping = False

    def attach(self, participant: LoopParticipant) -> None:
        if self._participant is not None:
            raise RuntimeError(f"{self._name} already hosts a participant")
        self._participant = participant
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def detach(self, participant: LoopParticipant, timeout_s: float) -> bool:
        if participant is not self._participant or self._thread is None:
            return True
        self._stopping = True
        self._poke()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        with self._pipe_lock:
            os.close(self._r)
            os.close(self._w)
            self._r = self._w = -1
        return True

    def wake(self) -> None:
        if not self._armed:
            self._armed = True
            self._poke()

    def _poke(self) -> None:
        with self._pipe_lock:
            if self._w >= 0:
                try:
                    os.write(self._w, b"\0")
                except (BlockingIOError, OSError):
                    pass  # full: a wake-up is pending anyway

    def health(self) -> dict[str, dict[str, Any]]:
        """Name -> health of the participant hosted (``status.health``)."""
        if self._participant is None:
            return {}
        with self._health_lock:
            return {participant_name(self._participant): self._health.as_status()}

    def _run(self) -> None:
        p = self._participant
        assert p is not None
        try:
            while not self._serve(p):
                pass
        finally:
            try:
                p.close()
            except Exception:  # logged, the thread ends anyway
                log.exception("event=participant_close_failed thread=%s", self._name)

    def _serve(self, p: LoopParticipant) -> bool:
        """Bind and loop; on a failure close, wait out the back-off and reopen. True when
        the thread is to end (stopped, or a participant that cannot be restarted failed)."""
        try:
            p.bind(self.wake)
            self._loop(p)
            return True
        except Exception as e:  # noqa: BLE001 - logged below: a dead participant is loud
            error: Exception = e
        while True:
            can_restart = callable(getattr(p, "reopen", None)) and not self._stopping
            with self._health_lock:
                wait = self._health.failed(error, restarting=can_restart)
            log.error("event=participant_failed participant=%s thread=%s error=%r action=%s",
                      participant_name(p), self._name, str(error),
                      f"restart_in_{wait:.1f}s" if can_restart else "dropped", exc_info=error)
            if not can_restart:
                return True
            try:
                p.close()
            except Exception:  # logged; it is reopened either way
                log.exception("event=participant_close_failed thread=%s", self._name)
            if self._sleep(wait):
                return True
            try:
                p.reopen()  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - counted, logged, tried again later
                error = e
                continue
            with self._health_lock:
                self._health.restarted()
            log.warning("event=participant_restarted participant=%s thread=%s",
                        participant_name(p), self._name)
            return False

    def _sleep(self, wait_s: float) -> bool:
        """Wait ``wait_s`` or until ``detach``; True when the thread is to stop."""
        deadline = time.monotonic() + wait_s
        while not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller = zmq.Poller()
            poller.register(self._r, zmq.POLLIN)
            if poller.poll(max(1, int(left * 1000))):
                self._armed = False  # before draining: a later wake writes again
                _drain(self._r)
        return True

    def _loop(self, p: LoopParticipant) -> None:
        poller = zmq.Poller()
        poller.register(self._r, zmq.POLLIN)
        while not self._stopping:
            for sock, flags in p.poll_items():
                poller.register(sock, flags)
            wait_ms = p.timeout_ms()
            timeout = MAX_POLL_MS if wait_ms is None else max(0, min(MAX_POLL_MS, wait_ms))
            due = float("inf") if wait_ms is None else time.monotonic() + wait_ms / 1000
            events = dict(poller.poll(timeout))
            if self._stopping:
                return
            if self._r in events:
                self._armed = False  # before draining: a later wake writes again
                _drain(self._r)
                p.after_burst()
            for sock, ev in events.items():
                if sock != self._r:
                    p.on_events(sock, ev)
            if time.monotonic() >= due:
                due = float("inf")
                p.on_timer()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass
