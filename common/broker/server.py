"""The broker's ZeroMQ front end: one server socket, one I/O thread; the request processors it
calls are ``common/broker/processors/`` (one per request code), which no front end owns.

The socket: without ``aclEnable`` the I/O thread's own TCP sockets, whose ZMTP replog speaks
itself (``common/broker/tcp_port.py``, ``common/format/zmtp.py``): no libzmq thread between a
request and this loop, and a whole message (frames and bytes) bounded before any of it is
kept, which libzmq's ROUTER cannot do; a message past the bound is dropped as it arrives and
its request answered BAD_REQUEST. With ``aclEnable`` a CURVE ROUTER (below). Either way a
connection has a routing identity and the rest of this module is the same.

Per request, in order: decode (``common.format.protocol``), the caller's account and the code's
permission (security on), the code's row in ``SPECS`` (a system topic refused, the in-flight
cap, BORNHOST for writes), then its processor with a ``Context``; what the processor hands back
is answered here (at once, when a Future completes, when a Deferred's owner settles it, or when
a parked long poll is released), the SUCCESS of an acked write through the lease gate last.

Threads::

    clients --tcp--> ROUTER  (owned by the I/O thread: recv, decode, dispatch, send)
    slaves  --tcp--> participants' sockets (e.g. the master's HA ROUTER), polled alongside
                        ^
                        |  Mailbox: bounded deque of completions + coalesced arrival notices,
                        |  and a self-pipe the I/O thread polls beside the ROUTER
    other threads ------+  (flush futures of store.put_nowait, replica waits, reput's
                           arrival listener for long polling, admin work, attach/detach)

* Only the I/O thread touches the socket. A processor answers at once (a ``Response``), hands
  back a ``concurrent.futures.Future[Response]`` (when it completes, on whatever thread, its
  result is posted to the mailbox and the I/O thread sends it), or hands back a ``Deferred``: a
  request its owner (a ``LoopWaits``, e.g. the SYNC_MASTER replica waits) keeps on the I/O thread
  and answers there. Another thread only reports to the owner and calls its ``wake``; one
  coalesced mailbox item then runs ``owner.poll`` here, which hands back every answer that report
  settled (one ack answers every put it covers, no Future per put). The loop also sleeps no
  longer than ``owner.timeout_ms()`` and then polls the owner for its deadlines, and answers
  every held request (``owner.release_all``) when it ends. (A self-pipe rather than an inproc
  socket: any thread can write it without owning a ZeroMQ socket, which keeps shutdown free of
  per-thread sockets.)
* Loop participants (``common.broker.loop``; the master's HA service): ``attach``/``detach`` (any
  thread, through the mailbox; ``detach`` returns once the participant's ``close`` ran here)
  put a component's sockets into this loop. After each burst of requests the loop calls their
  ``after_burst`` before reput (the HA service streams the new bytes at once), their
  ``on_events`` when their sockets are ready and ``on_timer`` at their ``timeout_ms``. An
  owner woken on this thread (``wake`` called from a participant reading an ack) is polled in
  the same pass, with no mailbox item: an ack answers the SYNC puts it covers right there. When
  the loop ends it closes every participant still attached.
* Requests are pipelined: answers carry the request's opaque id, in completion order.
* Local calls (``common/broker/local_calls.py``: the gRPC front end in this process): a
  request's frames served by ``_serve`` like a socket's (no ACL check: the front end checked
  its caller), answered to ``LocalCalls.deliver`` instead of the socket (their routing
  identity is 256 bytes long, which no ZeroMQ routing id is). The loop holds ``_turn`` for
  each turn and lets it go only to sleep in its poll; a call made meanwhile is served on the
  caller's thread under it (``_serve_local``: its appends dispatched there, the HA service
  poked by the append), else posted to the mailbox, and a turn that served any runs
  ``_after_burst`` as a burst from the socket does.
* A write carries its sender's address (``Request.born_host``, stored as BORNHOST): the
  connection's remote address, as RocketMQ takes the channel's, from the first frame's
  metadata (``common.format.zmq_frames.peer_address``), looked up once per connection (a
  ROUTER identity) and kept for ``PEER_CACHE`` connections.
* In-flight requests (waiting futures and parked long polls) are bounded by
  ``maxInflightRequests``; past that a request is answered SYSTEM_BUSY at once, so no queue grows
  without bound (STATUS and CLUSTER_INFO are always served: clients need them to find the
  master and the routes, and health checks to see the overload). A message past the bounds is
  dropped by the plain port as it arrives (with CURVE, a frame past ``maxFrameBytes`` is cut by
  ZeroMQ, ``ZMQ_MAXMSGSIZE``, which disconnects the peer); everything else malformed gets a
  typed error (``common.format.protocol``). The plain port's peers share a budget
  (``tcp_port.PortBudget``: connections, unread answers per peer and in all): a request of a
  peer over its share is not served (``TcpPort.admit``) but waits until the peer reads.
* Long polling (``common/broker/long_polling.py``): a processor parks a request by a key (a
  pull at the end of a queue with ``suspendMs`` > 0: the queue); reput's arrival listener
  (``on_arrival``) and the clock release it, and its answer (the read done again) is sent.
* ``drain`` (first SIGTERM): new requests are refused with SERVICE_NOT_AVAILABLE, parked polls
  answered, and the loop ends once nothing is in flight or the drain deadline passes.
* A loop participant that raises is logged, closed and restarted or dropped by ``Participants``
  (``participant_health``). An exception out of the loop itself (a bug) ends the I/O thread:
  it is logged at ERROR (``event=io_thread_died``), kept in ``failure``, and ``on_fatal`` (the
  broker) is told, which stops the process with a non-zero status: this thread owns the
  socket and every request in flight, so there is nothing to restart in place.
* Security (``common/broker/security.py``, with ``aclEnable``): the ROUTER is a CURVE server
  whose Context runs the ZAP authenticator, started on this thread before the bind. Each
  request's first frame is read with ``copy=False`` for its ZAP User-Id (the client's public
  key), which is mapped to its account in the ACL in force and checked against the request
  code's permission (its row in ``SPECS``, checked by ``common.format.acl``) before anything
  else looks at it; a refusal
  is answered NO_PERMISSION, audited and counted. ROUTER_HANDOVER is off then: a peer claiming
  another connection's routing id would otherwise take over its answers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from common.broker.client_requests import Ask, ClientRequests
from common.broker.local_calls import IDENTITY as LOCAL_IDENTITY
from common.broker.local_calls import LocalCall, LocalCalls
from common.broker.long_polling import LongPoll, LongPolls
from common.broker.loop import LoopParticipant, Participants
from common.broker.mailbox import Mailbox
from common.broker.processors import PROCESSORS
from common.broker.processors.context import Caller, Context, Services
from common.broker.replies import Answers, Deferred, LoopWaits, reply
from common.broker.security import CLIENT_DOMAIN, HandshakeMonitor, Security, user_id
from common.broker.server_stats import ServerStats
from common.broker.tcp_port import PortBudget, TcpPort
from common.core.errors import BrokerError, ResponseCode
from common.core.logs import log_event
from common.format import zmtp
from common.format.acl import Account, Denial, rule_for
from common.format.boundary import topic_refusal
from common.format.protocol import (
    RESPONSE_MARK,
    SPECS,
    TO_BROKER,
    WRITE,
    Limits,
    ProtocolError,
    Request,
    RequestCode,
    Response,
    decode_request,
    encode_response,
    error_response,
)
from common.format.zmq_frames import NOBLOCK, peer_address, readable, recv_rest, send_frames

RECV_BURST = 256  # requests read before looking at the mailbox again
MAX_POLL_MS = 100
CLOSE_LINGER_MS = 2000  # answers sent while draining get this long to leave on a loaded box
DRAIN_GRACE_S = 0.3  # drained: connections stay open this long after the last answer
LEASE_RECHECK_MS = 10  # answers held for the controller lease are looked at again this often
PEER_CACHE = 4096  # connections whose address is remembered (oldest forgotten first)
RCVMORE = int(zmq.RCVMORE)


log = logging.getLogger("replog.server")
# A NamedTuple's __new__ is a Python function; tuple.__new__ with every field is not (hot paths)
_new_tuple = tuple.__new__
# from the request table (common.format.protocol.SPECS): writes whose SUCCESS promises a stored
# message (a controller-mode master checks its lease last), requests served past the in-flight
# cap, requests whose ``topic`` a client names (a system topic is refused), writes
_ACKED_WRITES = frozenset(c for c, s in SPECS.items() if s.acked)
_ALWAYS_SERVED = frozenset(c for c, s in SPECS.items() if s.always_served)
_NAMES_TOPIC = frozenset(c for c, s in SPECS.items() if s.names_topic)
_WRITES = frozenset(c for c, s in SPECS.items() if s.kind == WRITE)
_PEER = frozenset(c for c, s in SPECS.items() if s.kind == WRITE or s.peer)
_CLIENT_SERVED = frozenset(c for c, s in SPECS.items() if s.served_by != TO_BROKER)


# ---- completions held by the loop -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Done:
    identity: bytes
    opaque: int
    code: RequestCode
    started: float
    future: concurrent.futures.Future


@dataclasses.dataclass(frozen=True)
class _Wake:
    owner: LoopWaits


class _Recheck:
    """A mailbox item that only wakes the loop: a local call served on its caller's thread
    left something waiting (a SYNC put, a parked POP, a held SEND_OK), whose deadline the
    loop's poll, computed before, does not know yet."""


_RECHECK = _Recheck()


@dataclasses.dataclass(frozen=True)
class _LeaseHeld:
    """A SEND_OK the reply gate held back: its master's controller lease lapsed between the
    append and the answer (the ZooKeeper connection moving to another server, say). It leaves
    as soon as the gate lets it (the lease confirmed again in the session the master was
    elected in: no election can have happened meanwhile), or as the gate's final answer at
    ``deadline``."""

    identity: bytes
    code: RequestCode
    resp: Response
    started: float
    deadline: float


# ---- the server -------------------------------------------------------------------------------


class PutPath(Protocol):
    """A master's native put path (``master/put_path.py``), as the request server calls it."""

    def take(self, burst: list[tuple[bytes, list[bytes]]], start: int,
             peers: dict[bytes, tuple[str, int]], limits: Limits,
             room: int) -> tuple[int, list[tuple[bytes, bytes]] | Deferred, int]: ...


class RequestServer:
    """The ROUTER loop; ``start`` runs it on its own thread, ``drain``/``stop`` end it."""

    def __init__(self, cfg: Any, services: Services, bind: str | None = None,
                 security: Security | None = None):
        self.cfg = cfg
        self.services = services
        self.security = security if security is not None else Security()
        self._handshakes: HandshakeMonitor | None = None  # security on: counts handshakes
        self.limits = Limits.from_config(cfg)
        self.bind = bind or f"tcp://0.0.0.0:{cfg.listenPort}"
        self.stats = ServerStats()
        self.max_inflight = cfg.maxInflightRequests
        self._mailbox = Mailbox(capacity=self.max_inflight * 2 + 64)
        self._polls = LongPolls()  # parked long polls (common/broker/long_polling.py)
        self._waits: set[LoopWaits] = set()  # owners holding Deferreds
        self._waits_due = float("inf")  # monotonic time of the owners' earliest deadline
        self._due_owners: list[LoopWaits] = []  # woken on the I/O thread: poll this pass
        self._participants = Participants(self._mailbox.post)  # common/broker/loop.py
        # requests this broker sends to clients on their connections (client_requests.py)
        self.client_requests = ClientRequests(self._mailbox.post, self.limits.for_responses())
        # The I/O thread holds this for its whole turn and lets go only to sleep in its poll;
        # a local call made meanwhile is served on its caller's thread under it
        # (``_serve_local``), so nothing of the loop ever runs beside a request.
        self._turn = threading.Lock()
        self._serving: zmq.Socket[bytes] | None = None  # under _turn: the loop runs
        # requests from this process (the gRPC front end), answered with no socket
        self.local = LocalCalls(self._mailbox.post, self.limits, serve=self._serve_local,
                                serve_many=self._serve_local_many)
        self._io_ident = 0
        self._ctx = zmq.Context(io_threads=1)
        self._sock: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        # set by drain/stop (any thread), read by the I/O thread: plain flags (an Event's
        # is_set is a Python-level call, three a request)
        self._draining = False
        self._closing_at = float("inf")  # drained: the loop ends at this time (DRAIN_GRACE_S)
        self._drain_deadline = float("inf")
        self._stopped = False
        self._bound = threading.Event()
        self._bind_error: BaseException | None = None
        # controller mode: the last look at a SEND_OK before it leaves (Broker._reply_gate):
        # gate(resp, final) -> the answer to send, or None (not final only) to hold it and ask
        # again, for at most reply_hold_s
        self.reply_gate: Callable[[Response, bool], Response | None] | None = None
        self.reply_hold_s = 0.0
        self._lease_held: list[_LeaseHeld] = []
        # the running master's native put path (master/put_path.py), asked once per burst;
        # None: every request by the Python path
        self.put_path_of: Callable[[], PutPath | None] | None = None
        self._peers: dict[bytes, tuple[str, int]] = {}  # ROUTER identity -> (ip, port)
        # without CURVE the port is the I/O thread's own TCP sockets, read by replog's ZMTP
        self._tcp: TcpPort | None = None
        self._handle: Callable[[bytes, list[bytes]], None] = lambda _identity, _frames: None
        self.failure = ""  # why the I/O thread died ("" while it runs or after a clean end)
        self.on_fatal: Callable[[str], None] | None = None  # told when the I/O thread dies

    # -- lifecycle (any thread) ------------------------------------------------------------------
    def start(self, timeout_s: float = 5.0) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-io", daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout_s):
            raise RuntimeError("request server did not bind in time")
        if self._bind_error is not None:
            raise self._bind_error

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store arrival listener (reput thread): wake parked long polls of this queue."""
        keys = self._polls.keys
        if (topic, queue_id) in keys:
            self._mailbox.arrival(topic, queue_id, max_offset)
        if (topic, -1) in keys:  # a POP of every queue of the topic
            self._mailbox.arrival(topic, -1, max_offset)

    def drain(self, timeout_s: float) -> bool:
        """Refuse new work, answer parked polls, wait for in-flight; True if all finished."""
        self._drain_deadline = time.monotonic() + timeout_s
        self._draining = True
        self._mailbox.post(("drain", None))
        return self.join(timeout_s + 1.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._drain_deadline = time.monotonic()
        self._draining = True
        self._stopped = True
        try:
            self._mailbox.post(("stop", None))
        except (BrokerError, OSError):
            pass
        self.join(timeout_s)

    def join(self, timeout_s: float) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- loop participants (any thread; common/broker/loop.py) ----------------------------------------
    def attach(self, participant: LoopParticipant) -> None:
        """Drive ``participant`` on the I/O thread from its next pass (before ``start`` too)."""
        self._participants.attach(participant)

    def detach(self, participant: LoopParticipant, timeout_s: float) -> bool:
        """Stop driving ``participant``; True once its ``close`` ran on the I/O thread (also
        when the loop ended first: it closes every participant); False after ``timeout_s``."""
        return self._participants.detach(participant, timeout_s)

    def port_figures(self) -> dict[str, int]:
        """The plain client port's budget figures (``TcpPort.figures``); none with CURVE."""
        tcp = self._tcp
        return {} if tcp is None else tcp.figures()

    def participant_health(self) -> dict[str, dict[str, Any]]:
        """Name -> state, failures, restarts and last error of each participant."""
        return self._participants.health()

    # -- the I/O thread ------------------------------------------------------------------------
    def _run(self) -> None:
        self._io_ident = threading.get_ident()
        security = self.security
        auth = None
        sock: Any = None  # a zmq socket, or the TcpPort
        try:
            auth = security.start_authenticator(self._ctx)  # before any bind in this Context
            if security.enabled:
                sock = security.server_socket(self._ctx, zmq.ROUTER, CLIENT_DOMAIN)
                self._handshakes = security.handshake_monitor(sock, CLIENT_DOMAIN)
                sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes)
                sock.setsockopt(zmq.ROUTER_HANDOVER, 0)
                sock.setsockopt(zmq.SNDHWM, 100_000)
                sock.setsockopt(zmq.RCVHWM, 100_000)
                sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
            else:  # every message bounded before it is kept, no libzmq thread (tcp_port.py)
                sock = self._tcp = TcpPort(self.bind, self.limits.max_batch_count + 1,
                                           self.limits.max_frame_bytes, self._peers,
                                           budget=PortBudget.from_config(self.cfg))
            if self._tcp is None:
                sock.setsockopt(zmq.LINGER, 1000)
                security.bind(sock, self.bind)
        except Exception as e:  # noqa: BLE001 - a bind error, a refused bind: start fails
            self._bind_error = OSError(f"cannot bind {self.bind}: {e}")
            self._participants.end()
            self._bound.set()
            if self._handshakes is not None:
                self._handshakes.close()
            if sock is not None and self._tcp is None:
                sock.close(linger=0)
            if auth is not None:
                auth.stop()
            self._ctx.term()
            return
        self._sock = sock
        self._bound.set()
        log_event(log, "server_listening", bind=self.bind, curve=security.enabled)
        try:
            self._loop(sock)
        except Exception as e:  # a bug in the loop: loud, and the broker exits (see above)
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("event=io_thread_died error=%r inflight=%d", self.failure,
                          self.stats.inflight)
        finally:
            self._draining = True  # nothing new is taken: the thread is gone
            self._participants.end()
            self.client_requests.closed = True
            if self._handshakes is not None:
                self._handshakes.close()
            if self._tcp is not None:
                self._tcp.shutdown(CLOSE_LINGER_MS)
            else:
                sock.close(linger=CLOSE_LINGER_MS)
            if auth is not None:
                auth.stop()
            self._ctx.term()
            self.client_requests.fail_all("the broker's request server stopped",
                                          self._mailbox.close())
            self.local.close("the broker's request server stopped")
            log_event(log, "server_stopped", inflight=self.stats.inflight)
        if self.failure and self.on_fatal is not None:
            self.on_fatal(self.failure)

    def _loop(self, sock: Any) -> None:
        participants = self._participants
        poller = zmq.Poller()
        # the TcpPort is polled by its epoll's descriptor, which the poll reports as an int
        port_key: Any = sock.fileno() if self._tcp is not None else sock
        poller.register(port_key, zmq.POLLIN)
        poller.register(self._mailbox.fileno(), zmq.POLLIN)
        handshakes = self._handshakes.socket if self._handshakes is not None else None
        if handshakes is not None:
            poller.register(handshakes, zmq.POLLIN)
        participants.begin(poller)
        mailbox_fd = self._mailbox.fileno()
        poll_deadlines, ask_deadlines = self._polls.deadlines, self.client_requests.deadlines
        tcp = self._tcp
        # the port's handler for a whole message, made once: a burst is one call of it each
        self._handle = lambda identity, frames: self._serve(sock, identity, frames)
        turn = self._turn
        turn.acquire()
        self._serving = sock
        try:
            self._turns(sock, port_key, poller, turn, participants, mailbox_fd, handshakes,
                        poll_deadlines, ask_deadlines, tcp)
        finally:
            self._serving = None
            turn.release()

    def _turns(self, sock: Any, port_key: Any, poller: zmq.Poller, turn: threading.Lock,
               participants: Participants, mailbox_fd: int, handshakes: Any,
               poll_deadlines: list[Any], ask_deadlines: list[Any],
               tcp: TcpPort | None) -> None:
        """The loop's turns, each under ``turn``; it is let go only for the poll."""
        while True:
            timeout = self._poll_timeout_ms()
            if participants.active or participants.restarting:
                wait_ms = participants.prepare(poller, time.monotonic())
                if wait_ms is not None:
                    timeout = max(0, min(timeout, wait_ms))
            if tcp is not None and tcp.release_due:  # held requests to serve: no sleep
                timeout = 0
            turn.release()
            try:
                events = dict(poller.poll(timeout))
            finally:
                turn.acquire()
            if mailbox_fd in events:
                self._handle_mailbox(sock)
            if handshakes is not None and handshakes in events:
                self._handshakes.drain()  # type: ignore[union-attr]
            if participants.polled:
                participants.on_events(events)
                if self._due_owners:  # e.g. acks read just now: answer the puts they cover
                    self._poll_due(sock)
            if port_key in events or (tcp is not None and tcp.release_due):
                self._receive(sock)
                self._after_burst()
            now = time.monotonic()
            if participants.active or participants.restarting:
                participants.on_timers(now)
            if poll_deadlines and poll_deadlines[0][0] <= now:
                for poll in self._polls.expire(now):
                    self._finish_poll(sock, poll)
            if ask_deadlines and ask_deadlines[0][0] <= now:
                self.client_requests.expire(now)
            if self._due_owners:
                self._poll_due(sock)
            if self._lease_held:
                self._release_lease_held(sock, now)
            if tcp is not None and now >= tcp.next_sweep:
                tcp.sweep(sock, now)
            if now >= self._waits_due:
                for owner in list(self._waits):
                    self._poll_waits(sock, owner)
            if self._draining and self._should_exit():
                self._release_waits(sock)
                self._release_lease_held(sock, now, final=True)
                if self._stopped or now >= self._closing_at:
                    return
                # Everything is answered: keep the connections a moment, so clients read the
                # last answers before their connection drops (libzmq drops an IMMEDIATE
                # socket's unread answers with it); a request meanwhile is refused.
                self._closing_at = min(self._closing_at, now + DRAIN_GRACE_S)

    def _serve_local(self, frames: list[bytes]) -> bool:
        """Any thread (``LocalCalls.call``): serve a local call on the caller's thread, now,
        if the I/O thread is asleep in its poll (its turn is free), by the one ``_serve``,
        under the turn lock, so nothing of the loop runs beside it. A request answered at once
        reaches ``LocalCalls.deliver`` before this returns; one held (a SYNC put waiting for
        its slave, a parked POP, a SEND_OK the lease gate holds) is answered by the loop later,
        as a posted call is. What was appended is dispatched here, before the answer can leave
        (as after a burst from the socket); the HA service, whose socket is the loop's, is
        poked by the append itself (an append from another thread than the loop's wakes it)
        and streams on the I/O thread. False: the loop is busy or not running (the caller
        posts the call instead).

        Why: a posted call costs two thread hand-offs, the I/O thread woken from its poll and
        the caller woken with the answer, each tens of microseconds on these VMs, more than
        serving a plain send (docs/benchmarks.md)."""
        return self._serve_inline(lambda sock: self._serve_locals(sock, [frames]))

    def _serve_local_many(self, many: list[list[bytes]]) -> bool:
        """``_serve_local`` for several local calls at once, in order, as one burst from the
        socket is served (``_serve_burst``: a run of plain SENDs is one native put), and
        dispatched once before any answer leaves. False: the loop is busy or not running."""
        return self._serve_inline(lambda sock: self._serve_locals(sock, many))

    def _serve_locals(self, sock: Any, many: list[list[bytes]]) -> None:
        """Local calls, in order, as a burst from the socket: their plain SENDs by the native
        put path (``_serve_burst``), the rest by ``_serve``."""
        if self._tcp is not None and self.put_path_of is not None:
            self._peers[LOCAL_IDENTITY] = self.local.born_host  # the address its records carry
            self._serve_burst(sock, [(LOCAL_IDENTITY, frames) for frames in many])
        else:
            for frames in many:
                self._serve(sock, LOCAL_IDENTITY, frames)

    def _serve_inline(self, serve: Callable[[Any], None]) -> bool:
        """``serve(socket)`` on the calling thread under the loop's turn lock, if the loop
        sleeps (False, nothing served, if it is busy or not running), its appends dispatched
        here before any answer leaves."""
        turn = self._turn
        if not turn.acquire(blocking=False):
            return False
        try:
            sock = self._serving
            if sock is None:
                return False
            inflight = self.stats.inflight
            # dispatched here before the answer can leave, as after a burst from the socket
            with self.services.store.dispatching_inline():
                serve(sock)
            if self.stats.inflight != inflight:  # left waiting: the loop must see its deadline
                try:
                    self._mailbox.post(_RECHECK)
                except BrokerError:  # a full mailbox: the loop is awake anyway
                    pass
            return True
        finally:
            turn.release()

    def _after_burst(self) -> None:
        """After a burst of requests: participants first (the HA service streams the new bytes
        to the slaves, whose acks the SYNC puts wait for), then reput, here, so puts need no
        cross-thread wake-up."""
        self._participants.after_burst()
        self.services.store.dispatch_inline()

    def _poll_due(self, sock: zmq.Socket[bytes]) -> None:
        while self._due_owners:
            self._poll_waits(sock, self._due_owners.pop())

    def _should_exit(self) -> bool:
        if self._stopped:
            return True
        return self.stats.inflight == 0 or time.monotonic() >= self._drain_deadline

    def _poll_timeout_ms(self) -> int:
        timeout = MAX_POLL_MS
        now = time.monotonic()
        if self._closing_at < now + MAX_POLL_MS / 1000:
            timeout = max(0, int((self._closing_at - now) * 1000) + 1)
        deadlines = self._polls.deadlines  # a heap: its first is the next
        if deadlines:
            timeout = max(0, min(timeout, int((deadlines[0][0] - now) * 1000) + 1))
        if self._lease_held:
            timeout = min(timeout, LEASE_RECHECK_MS)
        asks = self.client_requests.deadlines
        if asks:
            timeout = max(0, min(timeout, int((asks[0][0] - now) * 1000) + 1))
        self._waits_due = float("inf")
        for owner in self._waits:
            wait_ms = owner.timeout_ms()
            if wait_ms is not None:
                timeout = max(0, min(timeout, wait_ms))
                self._waits_due = min(self._waits_due, now + wait_ms / 1000)
        return timeout

    def _receive(self, sock: Any) -> None:
        """A burst of requests: what the TcpPort has ready, or the CURVE ROUTER's."""
        if self._tcp is not None:
            if self.put_path_of is None:
                self._tcp.serve(self._handle)
            else:  # the whole burst first: its plain SENDs go to the native path together
                burst: list[tuple[bytes, list[bytes]]] = []
                self._tcp.serve(self._handle, burst)
                if burst:
                    self._serve_burst(sock, burst)
            if self._tcp.dropped:
                self._refuse_oversized(sock, self._tcp)
            return
        self._receive_secure(sock)

    def _serve_burst(self, sock: Any, burst: list[tuple[bytes, list[bytes]]]) -> None:
        """A burst from the client port, in order: each run of plain SENDs the running
        master's native path takes (``master/put_path.py``), every other request by
        ``_serve``. The path is not asked while the server drains, is full, or has a reply
        gate (controller mode); those turn every request away or hold answers, in Python. A
        request of a peer past its share of the port's budget waits (``TcpPort.admit``), and
        so do that peer's later ones in the burst."""
        i, n = 0, len(burst)
        while i < n:
            path = self.put_path_of() if self.put_path_of is not None else None
            if path is not None and not self._draining and self.reply_gate is None \
                    and self.stats.inflight < self.max_inflight:
                started = time.monotonic()
                i, answers, messages = path.take(burst, i, self._peers, self.limits,
                                                 self.max_inflight - self.stats.inflight)
                if isinstance(answers, Deferred):  # a SYNC_MASTER's run: when its slaves ack
                    self._hold_run(answers, started)
                elif answers:
                    self._answer_taken(answers, messages, started)
                if i >= n:
                    return
            identity, frames = burst[i]
            i += 1
            tcp = self._tcp
            if tcp is not None and not tcp.admit(identity):  # its answers unread
                burst[i:] = tcp.hold_rest(identity, frames, burst[i:])
                n = len(burst)
                continue
            self._serve(sock, identity, frames)

    def _hold_run(self, held: Deferred, started: float) -> None:
        """A run of the native path held by its owner (its replica waits) as one Deferred;
        each of its requests counts in flight, as each held put does."""
        held.started = started
        self.stats.inflight += len(held.run or ())
        owner = held.owner
        if owner not in self._waits:
            self._waits.add(owner)
            owner.bind(self._wake_owner)

    def _answer_taken(self, answers: list[tuple[bytes, bytes]], messages: int,
                      started: float) -> None:
        """The SEND_OKs of the native path's run: counted as ``_serve`` and ``_account``
        count each, and written."""
        count = len(answers)
        stats = self.stats
        stats.requests += count
        stats.put_msgs.add(messages)
        stats.put_latency.add_many((time.monotonic() - started) * 1000, count)
        write = self._tcp.write  # type: ignore[union-attr]  # runs come with the TcpPort
        for identity, data in answers:
            if len(identity) > 255:  # a local call's (LOCAL_IDENTITY): its one frame handed back
                self.local.deliver([data[2:] if data[0] & zmtp.LONG == 0 else data[9:]])
            else:
                write(None, identity, data)

    def _refuse_oversized(self, sock: Any, port: TcpPort) -> None:
        """Messages past the bounds, dropped as they arrived: each request whose header came
        whole is answered the error its size gets (nothing else of it was kept)."""
        dropped_now, port.dropped = port.dropped, []
        for identity, dropped in dropped_now:
            self.stats.bad_requests += 1
            head = dropped.head
            if head is None or head[:1] == RESPONSE_MARK:
                continue
            err = ProtocolError("frames", f"{dropped.reason} in one message "
                                f"({dropped.frames} frames, {dropped.size} bytes)",
                                opaque=_opaque_of([head], self.limits))
            self._send(sock, identity, error_response(err))

    def _born_host(self, identity: bytes, first: zmq.Frame | None) -> tuple[str, int]:
        """The sender's address, once per connection (syscalls), then from the cache; a local
        call's (no frame) is the one ``local`` names."""
        if first is None:
            return self.local.born_host
        host = self._peers.get(identity)
        if host is None:
            host = self._peers[identity] = peer_address(first)
            if len(self._peers) > PEER_CACHE:
                del self._peers[next(iter(self._peers))]
        return host

    def _receive_secure(self, sock: zmq.Socket[bytes]) -> None:
        """A burst from the CURVE ROUTER, the routing-id frame kept as a zmq.Frame: its
        metadata carry the connection's ZAP User-Id and peer address."""
        for i in range(RECV_BURST):
            if i and not readable(sock):
                return
            try:
                head = sock.recv(NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = recv_rest(sock, head)
            if not frames:
                continue  # no header: cannot be answered
            self._serve(sock, head.bytes, frames, head)

    def _serve(self, sock: zmq.Socket[bytes], identity: bytes, frames: list[bytes],
               head: zmq.Frame | None = None) -> None:
        started = time.monotonic()
        self.stats.requests += 1
        account: Account | None = None
        user = ""
        secure = head is not None and self.security.enabled
        if secure:  # who is asking, in the ACL in force now
            assert head is not None
            user = user_id(head)
            found = self.security.account_of(user, head)
            if isinstance(found, Denial):
                self._refuse(sock, identity, _opaque_of(frames, self.limits), user, head, found)
                return
            account = found
        if frames[0][:1] == RESPONSE_MARK:  # a client answers what this broker asked it
            self.stats.requests -= 1
            malformed = self.client_requests.answer(identity, frames)
            if malformed is not None:  # garbage, not an answer: told, like any bad frame
                self.stats.bad_requests += 1
                self._send(sock, identity, error_response(malformed))
            return
        try:
            req = decode_request(frames, self.limits)
        except ProtocolError as e:
            if secure and account is not None and head is not None \
                    and e.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                denial = account.may_admin("an unknown request code")
                if denial is not None:
                    self._refuse(sock, identity, e.opaque, user, head, denial)
                    return
            self.stats.bad_requests += 1
            self._send(sock, identity, error_response(e))
            return
        if req.code in _CLIENT_SERVED:
            self.stats.bad_requests += 1
            self._send(sock, identity, encode_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, req.opaque,
                f"{req.code.name} is a request the broker sends to clients"))
            return
        caller = None
        if secure and account is not None and head is not None:
            denial = rule_for(req.code)(account, req.fields)
            if denial is not None:
                self._refuse(sock, identity, req.opaque, user, head, denial)
                return
            caller = Caller(account, user, head)
        refusal = topic_refusal(req.fields["topic"]) if req.code in _NAMES_TOPIC else None
        if refusal is not None:
            self.stats.bad_requests += 1
            self._answer(sock, identity, reply(req, ResponseCode.NO_PERMISSION,
                                               f"topic {refusal}"), started)
            return
        if self._draining:
            self._answer(
                sock,
                identity,
                reply(req, ResponseCode.SERVICE_NOT_AVAILABLE, "broker is shutting down"),
                started,
            )
            return
        if self.stats.inflight >= self.max_inflight and req.code not in _ALWAYS_SERVED:
            self.stats.refused_busy += 1
            self._answer(
                sock,
                identity,
                reply(req, ResponseCode.SYSTEM_BUSY, f"{self.stats.inflight} requests in flight"),
                started,
            )
            return
        if req.code in _PEER:  # tuple.__new__: no Python-level __new__
            req = _new_tuple(Request, (req.code, req.opaque, req.fields, req.bodies,
                                       self._peers.get(identity)
                                       or self._born_host(identity, head)))
        self._dispatch(sock, identity, req, started, caller)

    def _refuse(self, sock: zmq.Socket[bytes], identity: bytes, opaque: int, user: str,
                head: zmq.Frame, denial: Denial) -> None:
        """NO_PERMISSION (not retriable), audited; nothing else runs for the request."""
        self.stats.refused_permission += 1
        remark = self.security.refused("client", user, head, denial)
        self._send(sock, identity, encode_response(ResponseCode.NO_PERMISSION, opaque, remark,
                                                   {"account": denial.account}))

    def _dispatch(self, sock: zmq.Socket[bytes], identity: bytes, req: Request, started: float,
                  caller: Caller | None = None) -> None:
        ctx = _new_tuple(Context, (self.services, caller, identity, started, self._park,
                                   self._audit, self.client_requests.ask, self._draining))
        try:
            outcome = PROCESSORS[req.code](ctx, req)
        except ProtocolError as e:
            e.opaque = req.opaque
            self.stats.bad_requests += 1
            self._send(sock, identity, error_response(e))
            return
        except BrokerError as e:
            outcome = reply(req, e.code, e.remark)
        except Exception as e:  # noqa: BLE001 - a processor's bug must not stop the broker
            log_event(log, "processor_failed", logging.ERROR, code=req.code.name, error=repr(e))
            outcome = reply(req, ResponseCode.SYSTEM_ERROR, f"internal error: {e!r}")
        if outcome is None:
            return  # parked (long poll)
        if isinstance(outcome, Response):
            self._answer(sock, identity, outcome, started, req.code)
            return
        if isinstance(outcome, Deferred):
            self._hold(identity, req, started, outcome)
            return
        self._await(sock, identity, req, started, outcome)

    def _hold(self, identity: bytes, req: Request, started: float, held: Deferred) -> None:
        held.identity = identity
        held.code = req.code
        held.started = started
        self.stats.inflight += 1
        owner = held.owner
        if owner not in self._waits:
            self._waits.add(owner)
            owner.bind(self._wake_owner)

    def _wake_owner(self, owner: LoopWaits) -> None:
        """Any thread: have the I/O thread run ``owner.poll`` (the owner coalesces its wakes).
        On the I/O thread itself (an HA ack read by a participant) it is polled in this pass."""
        if threading.get_ident() == self._io_ident:
            self.stats.wakes_inline += 1
            self._due_owners.append(owner)
        else:
            self.stats.wakes_posted += 1
            self._mailbox.post(_Wake(owner))

    def _poll_waits(self, sock: zmq.Socket[bytes], owner: LoopWaits) -> None:
        self._send_answers(sock, owner.poll())
        if not owner.pending:
            self._waits.discard(owner)

    def _release_waits(self, sock: zmq.Socket[bytes]) -> None:
        for owner in list(self._waits):
            self._send_answers(sock, owner.release_all())
        self._waits.clear()

    def _send_answers(self, sock: zmq.Socket[bytes], answers: Answers) -> None:
        for held, resp in answers:
            run = held.run
            if run is not None:  # a native run: its answers made for the status it ended with
                self.stats.inflight -= len(run)
                self._answer_taken(run, held.run_messages, held.started)
                continue
            self.stats.inflight -= 1
            self._reply(sock, held.identity, held.code, resp, held.started)

    def _await(
        self,
        sock: zmq.Socket[bytes],
        identity: bytes,
        req: Request,
        started: float,
        fut: concurrent.futures.Future,
    ) -> None:
        done = _Done(identity, req.opaque, req.code, started, fut)
        if fut.done():
            self._complete(sock, done)
            return
        self.stats.inflight += 1
        fut.add_done_callback(lambda _f: self._mailbox.post(done))

    def _complete(self, sock: zmq.Socket[bytes], done: _Done) -> None:
        try:
            resp = done.future.result()
        except BrokerError as e:
            resp = Response(e.code, done.opaque, e.remark, {}, [])
        except Exception as e:  # noqa: BLE001 - answered as SYSTEM_ERROR, loop keeps serving
            log_event(log, "request_failed", logging.ERROR, code=done.code.name, error=repr(e))
            resp = Response(
                ResponseCode.SYSTEM_ERROR, done.opaque, f"internal error: {e!r}", {}, []
            )
        self._reply(sock, done.identity, done.code, resp, done.started)

    def _answer(
        self,
        sock: zmq.Socket[bytes],
        identity: bytes,
        resp: Response,
        started: float,
        code: RequestCode | None = None,
    ) -> None:
        if code is not None:
            self._reply(sock, identity, code, resp, started)
            return
        self._send(sock, identity, _encode(resp))

    def _reply(self, sock: zmq.Socket[bytes], identity: bytes, code: RequestCode,
               resp: Response, started: float) -> None:
        """Gate, account and send the answer to a request of ``code``; a SEND_OK the gate
        holds waits in ``_lease_held`` (counted in flight, so a drain waits for it too)."""
        gated = self._gated(code, resp, False)
        if gated is None:
            self.stats.inflight += 1
            self.stats.answers_held_for_lease += 1
            self._lease_held.append(_LeaseHeld(identity, code, resp, started,
                                               time.monotonic() + self.reply_hold_s))
            return
        self._account(code, gated, started)
        self._send(sock, identity, _encode(gated))

    def _release_lease_held(self, sock: zmq.Socket[bytes], now: float,
                            final: bool = False) -> None:
        """Send the held answers the gate now lets go; at their deadline (or ``final``: the
        loop ends) the gate's final word, which is never to hold."""
        keep: list[_LeaseHeld] = []
        for held in self._lease_held:
            resp = self._gated(held.code, held.resp, final or now >= held.deadline)
            if resp is None:
                keep.append(held)
                continue
            self.stats.inflight -= 1
            self._account(held.code, resp, held.started)
            self._send(sock, held.identity, _encode(resp))
        self._lease_held = keep

    def _gated(self, code: RequestCode, resp: Response, final: bool) -> Response | None:
        gate = self.reply_gate
        if gate is None or resp.code != ResponseCode.SUCCESS or code not in _ACKED_WRITES:
            return resp
        resp_out = gate(resp, final)
        assert resp_out is not None or not final, "a final gate answer must not hold"
        return resp_out

    def _account(self, code: RequestCode, resp: Response, started: float) -> None:
        latency_ms = (time.monotonic() - started) * 1000
        if code in (RequestCode.SEND, RequestCode.SEND_BATCH):
            self.stats.put_latency.add(latency_ms)
            fields = resp.fields
            if "commitLogOffset" in fields:
                self.stats.put_msgs.add(len(fields.get("offsets") or (0,)))
        elif code == RequestCode.PULL:
            self.stats.get_latency.add(latency_ms)
            self.stats.get_msgs.add(len(resp.bodies))

    def _send(self, sock: zmq.Socket[bytes], identity: bytes, frames: list[bytes]) -> None:
        if len(identity) > 255:  # no ZeroMQ routing id is: a local call's (local_calls.py)
            self.local.deliver(frames)
            return
        try:
            if self._tcp is not None:  # the message framed here, written by the port
                self._tcp.send(sock, identity, frames)
                return
            send_frames(sock, frames, identity)
        except zmq.Again:
            log_event(log, "answer_dropped", logging.WARNING, reason="peer not reading")
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:  # a peer gone since it asked: nobody to tell
                log_event(log, "answer_dropped", logging.WARNING, reason=str(e))

    def _handle_mailbox(self, sock: zmq.Socket[bytes]) -> None:
        items, arrivals = self._mailbox.take()
        served = False
        for item in items:
            if type(item) is LocalCall:  # a request from this process (local_calls.py)
                self._serve_locals(sock, [item.frames])
                served = True
            elif isinstance(item, _Done):
                self.stats.inflight -= 1
                self._complete(sock, item)
            elif isinstance(item, _Wake):
                self._poll_waits(sock, item.owner)
            elif item is _RECHECK:
                pass  # woken to compute the poll's timeout again
            elif isinstance(item, Ask):
                self.client_requests.start(item, lambda who, frames: self._send(sock, who, frames),
                                           time.monotonic())
            elif self._participants.handle(item):
                pass
            elif item[0] == "drain":
                for poll in self._polls.take_all():
                    self._finish_poll(sock, poll)
        if served:  # as after a burst from the socket: stream to the slaves, dispatch
            self._after_burst()
        for key, max_offset in arrivals.items():
            for poll in self._polls.wake(key, max_offset):
                self._finish_poll(sock, poll)

    # -- what processors hand back to the front end (the I/O thread) ---------------------------
    def _park(self, poll: LongPoll) -> None:
        """A processor parks a long poll: answered when its key's arrival lets it, or at its
        deadline (``common/broker/long_polling.py``)."""
        self.stats.inflight += 1
        self.stats.long_polls += 1
        if self._polls.park(poll):  # a message beat the parking: its arrival told nobody
            key = poll.key
            assert isinstance(key, tuple)
            self._mailbox.arrival(key[0], key[1], poll.current())

    def _finish_poll(self, sock: zmq.Socket[bytes], poll: LongPoll) -> None:
        self.stats.inflight -= 1
        try:
            resp = poll.answer()
        except Exception as e:  # noqa: BLE001 - answered as SYSTEM_ERROR, loop keeps serving
            log_event(log, "pull_failed", logging.ERROR, error=repr(e))
            resp = reply(poll.req, ResponseCode.SYSTEM_ERROR, f"internal error: {e!r}")
        self._account(RequestCode.PULL, resp, poll.started)
        self._send(sock, poll.identity, _encode(resp))

    def _audit(self, caller: Caller | None, denial: Denial) -> str:
        """A refusal a processor finds (a look-up's message in a topic the caller may not
        read): counted and audited; the remark the caller gets (``Context.refused``)."""
        self.stats.refused_permission += 1
        if caller is None:
            return denial.remark("")
        return self.security.refused("client", caller.user, caller.handle, denial)


# ---- helpers ----------------------------------------------------------------------------------

def _opaque_of(frames: list[bytes], limits: Limits) -> int:
    """The opaque of a request refused before it was looked at (UNKNOWN_OPAQUE if none)."""
    try:
        return decode_request(frames, limits).opaque
    except ProtocolError as e:
        return e.opaque


def _encode(resp: Response) -> list[bytes]:
    return encode_response(resp.code, resp.opaque, resp.remark, resp.fields, resp.bodies)
