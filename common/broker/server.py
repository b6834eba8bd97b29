"""The broker's request server: one ZeroMQ ROUTER, one I/O thread, the processors every role serves.

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
* A write carries its sender's address (``Request.born_host``, stored as BORNHOST): the
  connection's remote address, as RocketMQ takes the channel's, from the first frame's
  metadata (``common.format.zmq_frames.peer_address``), looked up once per connection (a
  ROUTER identity) and kept for ``PEER_CACHE`` connections.
* In-flight requests (waiting futures and parked long polls) are bounded by
  ``maxInflightRequests``; past that a request is answered SYSTEM_BUSY at once, so no queue grows
  without bound (STATUS and CLUSTER_INFO are always served: clients need them to find the
  master and the routes, and health checks to see the overload). Oversized single frames are cut by ZeroMQ itself (``ZMQ_MAXMSGSIZE``, which
  disconnects the peer); everything else malformed gets a typed error (``common.format.protocol``).
* Long polling: a pull at the end of a queue with ``suspendMs`` > 0 is parked until reput reports
  a new message for that queue (``store.add_arrival_listener``) or the wait ends; the parked pull
  is re-run and answered.
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
  code's rule (``common.format.acl.REQUEST_RULES``) before anything else looks at it; a refusal
  is answered NO_PERMISSION, audited and counted. ROUTER_HANDOVER is off then: a peer claiming
  another connection's routing id would otherwise take over its answers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import zmq

from common.broker.consumer_groups import ConsumerGroups
from common.broker.loop import LoopParticipant, Participants
from common.broker.mailbox import Mailbox
from common.broker.replies import Answers, Deferred, LoopWaits, Reply, reply
from common.broker.security import CLIENT_DOMAIN, HandshakeMonitor, Security, user_id
from common.broker.server_stats import ServerStats
from common.core.errors import BrokerError, CorruptMessageError, GetStatus, PullStatus, ResponseCode
from common.core.logs import log_event
from common.core.message import (
    PROPERTY_REAL_TOPIC,
    decode_msg_id,
    is_system_topic,
    subscribed_tags,
    tags_code,
)
from common.format.acl import SUB, Account, Denial, rule_for
from common.format.protocol import (
    LOG_CHECKSUM_MAX_BYTES,
    WRITE_CODES,
    Limits,
    ProtocolError,
    Request,
    RequestCode,
    Response,
    decode_request,
    encode_response,
    error_response,
)
from common.format.zmq_frames import NOBLOCK, peer_address, readable, send_frames

RECV_BURST = 256  # requests read before looking at the mailbox again
MAX_POLL_MS = 100
CLOSE_LINGER_MS = 2000  # answers sent while draining get this long to leave on a loaded box
DRAIN_GRACE_S = 0.3  # drained: connections stay open this long after the last answer
LEASE_RECHECK_MS = 10  # answers held for the controller lease are looked at again this often
PEER_CACHE = 4096  # connections whose address is remembered (oldest forgotten first)
PULL_MAX_BYTES = 4 * 1024 * 1024  # bytes of records in one pull answer
RCVMORE = int(zmq.RCVMORE)


log = logging.getLogger("replog.server")
# writes whose SUCCESS promises a stored message (a controller-mode master checks its lease last)
_ACKED_WRITES = frozenset({RequestCode.SEND, RequestCode.SEND_BATCH,
                           RequestCode.CONSUMER_SEND_MSG_BACK})


# ---- what the server needs from the broker --------------------------------------------------


class Services(Protocol):
    """The broker as the processors see it (implemented by ``common.broker.broker.Broker``)."""

    store: Any

    def status(self) -> dict[str, Any]: ...

    def cluster_info(self) -> dict[str, Any]: ...  # CLUSTER_INFO: groups, brokers, topics

    def topic_queue_nums(self, topic: str) -> tuple[int, bool]: ...  # (nums or 0, auto-create)

    def topic_layout(self, topic: str) -> dict[str, int]: ...  # group -> queues, the cluster's

    def commit_offset(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None: ...

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int: ...

    def config_document(self, code: RequestCode) -> bytes: ...  # GET_ALL_*: the JSON file

    consumer_groups: ConsumerGroups  # CONSUMER_HEARTBEAT

    def ensure_retry_topic(self, group: str) -> None: ...  # a master: %RETRY%<group> exists

    def handle_write(self, req: Request) -> Reply: ...

    def promote(self, req: Request) -> Reply: ...

    def clear_election_fault(self) -> str: ...  # controller mode: the fault it had ("" none)

    def log_checksum(self, req: Request) -> Reply: ...  # LOG_CHECKSUM, off the I/O thread


# ---- long polls and completions held by the loop ----------------------------------------------


@dataclasses.dataclass(eq=False)
class _Parked:
    """A long poll waiting for a message."""

    identity: bytes
    req: Request
    deadline: float
    started: float


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


class RequestServer:
    """The ROUTER loop; ``start`` runs it on its own thread, ``drain``/``stop`` end it."""

    def __init__(self, cfg: Any, services: Services, bind: str | None = None,
                 security: Security | None = None):
        self.cfg = cfg
        self.services = services
        self.security = security if security is not None else Security()
        self._caller: tuple[Account, str, zmq.Frame] | None = None  # the request being served
        self._handshakes: HandshakeMonitor | None = None  # security on: counts handshakes
        self.limits = Limits.from_config(cfg)
        self.bind = bind or f"tcp://0.0.0.0:{cfg.listenPort}"
        self.stats = ServerStats()
        self.max_inflight = cfg.maxInflightRequests
        self._mailbox = Mailbox(capacity=self.max_inflight * 2 + 64)
        self._parked: dict[tuple[str, int], list[_Parked]] = {}
        self._parked_keys: frozenset[tuple[str, int]] = frozenset()
        self._deadlines: list[tuple[float, int, tuple[str, int]]] = []
        self._waits: set[LoopWaits] = set()  # owners holding Deferreds
        self._waits_due = float("inf")  # monotonic time of the owners' earliest deadline
        self._due_owners: list[LoopWaits] = []  # woken on the I/O thread: poll this pass
        self._participants = Participants(self._mailbox.post)  # common/broker/loop.py
        self._io_ident = 0
        self._ctx = zmq.Context(io_threads=1)
        self._sock: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._draining = threading.Event()
        self._closing_at = float("inf")  # drained: the loop ends at this time (DRAIN_GRACE_S)
        self._drain_deadline = float("inf")
        self._stopped = threading.Event()
        self._bound = threading.Event()
        self._bind_error: BaseException | None = None
        self._seq = 0
        # controller mode: the last look at a SEND_OK before it leaves (Broker._reply_gate):
        # gate(resp, final) -> the answer to send, or None (not final only) to hold it and ask
        # again, for at most reply_hold_s
        self.reply_gate: Callable[[Response, bool], Response | None] | None = None
        self.reply_hold_s = 0.0
        self._lease_held: list[_LeaseHeld] = []
        self._peers: dict[bytes, tuple[str, int]] = {}  # ROUTER identity -> (ip, port)
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
        if (topic, queue_id) in self._parked_keys:
            self._mailbox.arrival(topic, queue_id, max_offset)

    def drain(self, timeout_s: float) -> bool:
        """Refuse new work, answer parked polls, wait for in-flight; True if all finished."""
        self._drain_deadline = time.monotonic() + timeout_s
        self._draining.set()
        self._mailbox.post(("drain", None))
        return self.join(timeout_s + 1.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._drain_deadline = time.monotonic()
        self._draining.set()
        self._stopped.set()
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

    def participant_health(self) -> dict[str, dict[str, Any]]:
        """Name -> state, failures, restarts and last error of each participant."""
        return self._participants.health()

    # -- the I/O thread ------------------------------------------------------------------------
    def _run(self) -> None:
        self._io_ident = threading.get_ident()
        security = self.security
        auth = None
        sock = None
        try:
            auth = security.start_authenticator(self._ctx)  # before any bind in this Context
            sock = security.server_socket(self._ctx, zmq.ROUTER, CLIENT_DOMAIN)
            self._handshakes = security.handshake_monitor(sock, CLIENT_DOMAIN)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 0 if security.enabled else 1)
            sock.setsockopt(zmq.SNDHWM, 100_000)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
            security.bind(sock, self.bind)
        except Exception as e:  # noqa: BLE001 - a bind error, a refused bind: start fails
            self._bind_error = OSError(f"cannot bind {self.bind}: {e}")
            self._participants.end()
            self._bound.set()
            if self._handshakes is not None:
                self._handshakes.close()
            if sock is not None:
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
            self._draining.set()  # nothing new is taken: the thread is gone
            self._participants.end()
            if self._handshakes is not None:
                self._handshakes.close()
            sock.close(linger=CLOSE_LINGER_MS)
            if auth is not None:
                auth.stop()
            self._ctx.term()
            self._mailbox.close()
            log_event(log, "server_stopped", inflight=self.stats.inflight)
        if self.failure and self.on_fatal is not None:
            self.on_fatal(self.failure)

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        participants = self._participants
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._mailbox.fileno(), zmq.POLLIN)
        handshakes = self._handshakes.socket if self._handshakes is not None else None
        if handshakes is not None:
            poller.register(handshakes, zmq.POLLIN)
        participants.begin(poller)
        while True:
            timeout = self._poll_timeout_ms()
            if participants.active or participants.restarting:
                wait_ms = participants.prepare(poller, time.monotonic())
                if wait_ms is not None:
                    timeout = max(0, min(timeout, wait_ms))
            events = dict(poller.poll(timeout))
            if self._mailbox.fileno() in events:
                self._handle_mailbox(sock)
            if handshakes is not None and handshakes in events:
                self._handshakes.drain()  # type: ignore[union-attr]
            if participants.polled:
                participants.on_events(events)
                self._poll_due(sock)  # e.g. acks read just now: answer the puts they cover
            if sock in events:
                self._receive(sock)
                self._after_burst()
            now = time.monotonic()
            if participants.active or participants.restarting:
                participants.on_timers(now)
            self._expire_polls(sock, now)
            self._poll_due(sock)
            if self._lease_held:
                self._release_lease_held(sock, now)
            if now >= self._waits_due:
                for owner in list(self._waits):
                    self._poll_waits(sock, owner)
            if self._draining.is_set() and self._should_exit():
                self._release_waits(sock)
                self._release_lease_held(sock, now, final=True)
                if self._stopped.is_set() or now >= self._closing_at:
                    return
                # Everything is answered: keep the connections a moment, so clients read the
                # last answers before their connection drops (libzmq drops an IMMEDIATE
                # socket's unread answers with it); a request meanwhile is refused.
                self._closing_at = min(self._closing_at, now + DRAIN_GRACE_S)

    def _after_burst(self) -> None:
        """After a burst of requests: participants first (the HA service streams the new bytes
        to the slaves, whose acks the SYNC puts wait for), then reput, here, so puts need no
        cross-thread wake-up."""
        self._participants.after_burst()
        dispatch = getattr(self.services.store, "dispatch_inline", None)
        if dispatch is not None:
            dispatch()

    def _poll_due(self, sock: zmq.Socket[bytes]) -> None:
        while self._due_owners:
            self._poll_waits(sock, self._due_owners.pop())

    def _should_exit(self) -> bool:
        if self._stopped.is_set():
            return True
        return self.stats.inflight == 0 or time.monotonic() >= self._drain_deadline

    def _poll_timeout_ms(self) -> int:
        timeout = MAX_POLL_MS
        now = time.monotonic()
        if self._closing_at < now + MAX_POLL_MS / 1000:
            timeout = max(0, int((self._closing_at - now) * 1000) + 1)
        if self._deadlines:
            wait = (self._deadlines[0][0] - now) * 1000
            timeout = max(0, min(timeout, int(wait) + 1))
        if self._lease_held:
            timeout = min(timeout, LEASE_RECHECK_MS)
        self._waits_due = float("inf")
        for owner in self._waits:
            wait_ms = owner.timeout_ms()
            if wait_ms is not None:
                timeout = max(0, min(timeout, wait_ms))
                self._waits_due = min(self._waits_due, now + wait_ms / 1000)
        return timeout

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        if self.security.enabled:
            self._receive_secure(sock)
            return
        for _ in range(RECV_BURST):
            if not readable(sock):
                return
            try:
                # the identity frame uncopied: it carries the connection's metadata
                first = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = sock.recv_multipart(zmq.NOBLOCK) if first.more else []
            if not frames:
                continue  # no routing identity or no header: cannot be answered
            self._serve(sock, first.bytes, frames, first)

    def _born_host(self, identity: bytes, first: zmq.Frame) -> tuple[str, int]:
        """The sender's address, once per connection (syscalls), then from the cache."""
        host = self._peers.get(identity)
        if host is None:
            host = self._peers[identity] = peer_address(first)
            if len(self._peers) > PEER_CACHE:
                del self._peers[next(iter(self._peers))]
        return host

    def _receive_secure(self, sock: zmq.Socket[bytes]) -> None:
        """As ``_receive``, the routing-id frame kept as a zmq.Frame: its metadata carry the
        connection's ZAP User-Id and peer address."""
        for _ in range(RECV_BURST):
            if not readable(sock):
                return
            try:
                head = sock.recv(NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = []
            while sock.getsockopt(RCVMORE):
                frames.append(sock.recv(NOBLOCK))
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
        if secure and account is not None and head is not None:
            denial = rule_for(req.code)(account, req.fields)
            if denial is not None:
                self._refuse(sock, identity, req.opaque, user, head, denial)
                return
            self._caller = (account, user, head)
        if req.code in _NAMES_TOPIC and is_system_topic(req.fields["topic"]):
            self.stats.bad_requests += 1
            self._answer(sock, identity, reply(
                req, ResponseCode.NO_PERMISSION,
                f"topic {req.fields['topic']} is a system topic: only the broker writes or "
                "reads it (its messages belong to other topics, each with its own ACL)"),
                started)
            return
        if self._draining.is_set():
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
        if req.code in WRITE_CODES and head is not None:
            req = req._replace(born_host=self._born_host(identity, head))
        try:
            self._dispatch(sock, identity, req, started)
        finally:
            self._caller = None

    def _refuse(self, sock: zmq.Socket[bytes], identity: bytes, opaque: int, user: str,
                head: zmq.Frame, denial: Denial) -> None:
        """NO_PERMISSION (not retriable), audited; nothing else runs for the request."""
        self.stats.refused_permission += 1
        remark = self.security.refused("client", user, head, denial)
        self._send(sock, identity, encode_response(ResponseCode.NO_PERMISSION, opaque, remark,
                                                   {"account": denial.account}))

    def _dispatch(
        self, sock: zmq.Socket[bytes], identity: bytes, req: Request, started: float
    ) -> None:
        try:
            outcome = self._process(identity, req, started)
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
        try:
            send_frames(sock, frames, identity)
        except zmq.Again:
            log_event(log, "answer_dropped", logging.WARNING, reason="peer not reading")
        except zmq.ZMQError as e:
            log_event(log, "answer_dropped", logging.WARNING, reason=str(e))

    def _handle_mailbox(self, sock: zmq.Socket[bytes]) -> None:
        items, arrivals = self._mailbox.take()
        for item in items:
            if isinstance(item, _Done):
                self.stats.inflight -= 1
                self._complete(sock, item)
            elif isinstance(item, _Wake):
                self._poll_waits(sock, item.owner)
            elif self._participants.handle(item):
                pass
            elif item[0] == "drain":
                self._answer_all_parked(sock)
        for key, max_offset in arrivals.items():
            self._wake_parked(sock, key, max_offset)

    # -- processors (the I/O thread) -----------------------------------------------------------
    def _process(self, identity: bytes, req: Request, started: float) -> Reply | None:
        code = req.code
        if code in WRITE_CODES:
            return self.services.handle_write(req)
        if code == RequestCode.PULL:
            return self._pull(identity, req, started)
        handler = self._READS.get(code)
        if handler is None:
            return reply(req, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"{code.name} not served")
        return handler(self, req)

    def _status(self, req: Request) -> Response:
        return reply(req, fields=self.services.status())

    def _promote(self, req: Request) -> Reply:
        return self.services.promote(req)

    def _clear_election_fault(self, req: Request) -> Response:
        try:
            had = self.services.clear_election_fault()
        except ValueError as e:
            return reply(req, ResponseCode.BAD_REQUEST, str(e))
        return reply(req, fields={"cleared": had})

    def _cluster_info(self, req: Request) -> Response:
        # a JSON body frame: groups -> members -> records nest deeper than a header may
        doc = json.dumps(self.services.cluster_info(), separators=(",", ":")).encode()
        return reply(req, fields={"format": "json"}, bodies=[doc])

    def _topic_route(self, req: Request) -> Response:
        topic = req.fields["topic"]
        nums, auto = self.services.topic_queue_nums(topic)
        if nums > 0:
            return reply(req, fields={"queueNums": nums})
        if auto:
            return reply(
                req,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic {topic} will be auto-created",
                {"queueNums": self.cfg.defaultTopicQueueNums},
            )
        return reply(req, ResponseCode.TOPIC_NOT_EXIST, f"no topic {topic}", {"queueNums": 0})

    def _commit_offset(self, req: Request) -> Response:
        f = req.fields
        client = f.get("clientId")
        if client:  # a group member: only the queue's owner in the group's view commits
            layout = self.services.topic_layout(f["topic"])
            if not self.services.consumer_groups.owns(
                    f["group"], client, f["topic"], f["queueId"], layout,
                    self.cfg.brokerName):
                return reply(req, ResponseCode.CONSUMER_NOT_ONLINE,
                             f"{client} does not own {f['topic']}/{f['queueId']} in group "
                             f"{f['group']} now (its session ran out or the queue moved): "
                             "offset not committed")
        self.services.commit_offset(f["group"], f["topic"], f["queueId"], f["queueOffset"])
        return reply(req)

    def _fetch_offset(self, req: Request) -> Response:
        f = req.fields
        offset = self.services.fetch_offset(f["group"], f["topic"], f["queueId"])
        return reply(req, fields={"queueOffset": offset})

    def _query_by_key(self, req: Request) -> Response:
        f = req.fields
        found = self.services.store.query_by_key(
            f["topic"], f["key"], max_nums=f["maxNums"], begin_ms=f["beginMs"], end_ms=f["endMs"]
        )
        return _messages_reply(req, found, self.services.store)

    def _query_by_msg_id(self, req: Request) -> Response:
        msg_id = req.fields["msgId"]
        try:
            ip, port, phy_offset = decode_msg_id(msg_id)
        except ValueError as e:
            raise ProtocolError("msgId", str(e)) from None
        found = self.services.store.message_by_msg_id(msg_id)
        if found is None:  # not here: the msgId may name another broker's record
            return reply(req, ResponseCode.QUERY_NOT_FOUND,
                         f"no message {msg_id} here: it names the broker at {ip}:{port} "
                         f"(CommitLog offset {phy_offset}), and no record stored by "
                         f"{ip}:{port} starts at that offset on this broker")
        return self._found_reply(req, [found])

    def _log_checksum(self, req: Request) -> Reply:
        f = req.fields
        if f["toOffset"] < f["fromOffset"]:
            raise ProtocolError("toOffset", f"{f['toOffset']} is below fromOffset "
                                f"{f['fromOffset']}")
        if f["toOffset"] - f["fromOffset"] > LOG_CHECKSUM_MAX_BYTES:
            raise ProtocolError("toOffset", f"at most {LOG_CHECKSUM_MAX_BYTES} bytes per "
                                "request (ask longer ranges in pieces)")
        return self.services.log_checksum(req)

    def _query_by_offset(self, req: Request) -> Response:
        found = self.services.store.message_by_offset(req.fields["phyOffset"])
        return self._found_reply(req, [found] if found is not None else [])

    def _found_reply(self, req: Request, found: list[Any]) -> Response:
        """A look-up by msgId or offset may name any topic: with security on, the caller
        needs SUB on the topic of what was found (``common.format.acl``)."""
        caller = self._caller
        if caller is not None:
            account, user, head = caller
            for msg in found:
                denial = account.may_topic(msg.topic, SUB)
                real = msg.properties.get(PROPERTY_REAL_TOPIC)
                if denial is None and real and is_system_topic(msg.topic):
                    denial = account.may_topic(real, SUB)  # a delayed message is real's
                if denial is not None:
                    self.stats.refused_permission += 1
                    remark = self.security.refused("client", user, head, denial)
                    return reply(req, ResponseCode.NO_PERMISSION, remark,
                                 {"account": denial.account})
        return _messages_reply(req, found, self.services.store)

    def _acl_info(self, req: Request) -> Response:
        return reply(req, fields=self.security.acl_info())

    def _consumer_heartbeat(self, req: Request) -> Response:
        f = req.fields
        members = self.services.consumer_groups.heartbeat(
            f["group"], f["clientId"], f["sessionTimeoutMs"], leave=bool(f["leave"]))
        if not f["leave"]:
            self.services.ensure_retry_topic(f["group"])
        return reply(req, fields={"members": members})

    def _config_document(self, req: Request) -> Response:
        return reply(req, bodies=[self.services.config_document(req.code)])

    def _search_offset(self, req: Request) -> Response:
        f = req.fields
        offset = self.services.store.offset_by_time(f["topic"], f["queueId"], f["timestamp"])
        return reply(req, fields={"offset": offset})

    def _max_offset(self, req: Request) -> Response:
        f = req.fields
        return reply(req, fields={"offset": self.services.store.max_queue_offset(f["topic"],
                                                                                 f["queueId"])})

    def _min_offset(self, req: Request) -> Response:
        f = req.fields
        return reply(req, fields={"offset": self.services.store.min_queue_offset(f["topic"],
                                                                                 f["queueId"])})

    _READS: ClassVar[dict[RequestCode, Callable[[RequestServer, Request], Reply]]] = {
        RequestCode.STATUS: _status,
        RequestCode.CLUSTER_INFO: _cluster_info,
        RequestCode.PROMOTE: _promote,
        RequestCode.CLEAR_ELECTION_FAULT: _clear_election_fault,
        RequestCode.TOPIC_ROUTE: _topic_route,
        RequestCode.COMMIT_OFFSET: _commit_offset,
        RequestCode.FETCH_OFFSET: _fetch_offset,
        RequestCode.QUERY_BY_KEY: _query_by_key,
        RequestCode.QUERY_BY_MSG_ID: _query_by_msg_id,
        RequestCode.QUERY_BY_OFFSET: _query_by_offset,
        RequestCode.LOG_CHECKSUM: _log_checksum,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _search_offset,
        RequestCode.GET_MAX_OFFSET: _max_offset,
        RequestCode.GET_MIN_OFFSET: _min_offset,
        RequestCode.CONSUMER_HEARTBEAT: _consumer_heartbeat,
        RequestCode.GET_ALL_TOPIC_CONFIG: _config_document,
        RequestCode.GET_ALL_CONSUMER_OFFSET: _config_document,
        RequestCode.GET_ALL_DELAY_OFFSET: _config_document,
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO: _acl_info,
    }

    # -- pull and long polling -------------------------------------------------------------------
    def _pull(self, identity: bytes, req: Request, started: float) -> Response | None:
        resp = self._read_queue(req)
        suspend_ms = min(req.fields["suspendMs"], self.cfg.longPollingMaxMs)
        if resp.code != ResponseCode.PULL_NOT_FOUND or suspend_ms <= 0 or self._draining.is_set():
            return resp
        f = req.fields
        key = (f["topic"], f["queueId"])
        parked = _Parked(identity, req, started + suspend_ms / 1000.0, started)
        self._parked.setdefault(key, []).append(parked)
        self._parked_keys = frozenset(self._parked)
        self._seq += 1
        heapq.heappush(self._deadlines, (parked.deadline, self._seq, key))
        self.stats.inflight += 1
        self.stats.long_polls += 1
        # A message that arrived between the read and the registration sent no notice: look again.
        if self._queue_max(key) > f["queueOffset"]:
            self._mailbox.arrival(key[0], key[1], self._queue_max(key))
        return None

    def _queue_max(self, key: tuple[str, int]) -> int:
        return int(self.services.store.max_queue_offset(key[0], key[1]))

    def _read_queue(self, req: Request) -> Response:
        f = req.fields
        tags = subscribed_tags(f.get("tags"))
        result = self.services.store.get_message(
            f.get("group") or "",
            f["topic"],
            f["queueId"],
            f["queueOffset"],
            f["maxNums"],
            None if tags is None else {tags_code(t) for t in tags},
            max_bytes=PULL_MAX_BYTES,
            tags=tags,
        )
        if result.status is GetStatus.CORRUPT_RECORD and result.corrupt is not None:
            q_off, phy, why = result.corrupt
            err = CorruptMessageError(q_off, phy, why)
            return reply(req, err.code, err.remark,
                         {"corruptQueueOffset": q_off, "corruptCommitLogOffset": phy,
                          "minOffset": result.min_offset, "maxOffset": result.max_offset})
        status, code = _PULL_STATUS[result.status]
        fields = {
            "status": status.value,
            "nextBeginOffset": result.next_begin_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
        }
        return reply(
            req,
            code,
            "" if code == ResponseCode.SUCCESS else result.status.value,
            fields,
            [bytes(r) for r in result.records],
        )

    def _wake_parked(self, sock: zmq.Socket[bytes], key: tuple[str, int], max_offset: int) -> None:
        waiting = self._parked.get(key)
        if not waiting:
            return
        still = []
        for parked in waiting:
            if parked.req.fields["queueOffset"] < max_offset:
                self._finish_parked(sock, parked)
            else:
                still.append(parked)
        self._set_parked(key, still)

    def _expire_polls(self, sock: zmq.Socket[bytes], now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, key = heapq.heappop(self._deadlines)
            waiting = self._parked.get(key, [])
            due = [p for p in waiting if p.deadline <= now]
            for parked in due:
                self._finish_parked(sock, parked)
            self._set_parked(key, [p for p in waiting if p.deadline > now])

    def _answer_all_parked(self, sock: zmq.Socket[bytes]) -> None:
        for key, waiting in list(self._parked.items()):
            for parked in waiting:
                self._finish_parked(sock, parked)
            self._set_parked(key, [])
        self._deadlines.clear()

    def _finish_parked(self, sock: zmq.Socket[bytes], parked: _Parked) -> None:
        self.stats.inflight -= 1
        try:
            resp = self._read_queue(parked.req)
        except Exception as e:  # noqa: BLE001 - answered as SYSTEM_ERROR, loop keeps serving
            log_event(log, "pull_failed", logging.ERROR, error=repr(e))
            resp = reply(parked.req, ResponseCode.SYSTEM_ERROR, f"internal error: {e!r}")
        self._account(RequestCode.PULL, resp, parked.started)
        self._send(sock, parked.identity, _encode(resp))

    def _set_parked(self, key: tuple[str, int], waiting: list[_Parked]) -> None:
        if waiting:
            self._parked[key] = waiting
        else:
            self._parked.pop(key, None)
            self._parked_keys = frozenset(self._parked)


# ---- helpers ----------------------------------------------------------------------------------

# store GetStatus -> (client PullStatus, response code), as RocketMQ's PullMessageProcessor maps them
_ALWAYS_SERVED = frozenset({RequestCode.STATUS, RequestCode.CLUSTER_INFO})  # past the cap too
# requests whose ``topic`` a client names, refused for a system topic (``is_system_topic``)
_NAMES_TOPIC = frozenset({
    RequestCode.SEND, RequestCode.SEND_BATCH, RequestCode.CREATE_TOPIC, RequestCode.PULL,
    RequestCode.QUERY_BY_KEY, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
    RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET, RequestCode.FETCH_OFFSET,
    RequestCode.COMMIT_OFFSET})
_PULL_STATUS: dict[GetStatus, tuple[PullStatus, ResponseCode]] = {
    GetStatus.FOUND: (PullStatus.FOUND, ResponseCode.SUCCESS),
    GetStatus.NO_MATCHED_MESSAGE: (PullStatus.NO_MATCHED_MSG, ResponseCode.PULL_RETRY_IMMEDIATELY),
    GetStatus.MESSAGE_WAS_REMOVING: (
        PullStatus.NO_MATCHED_MSG,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
    ),
    GetStatus.NO_MATCHED_LOGIC_QUEUE: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.NO_MESSAGE_IN_QUEUE: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.OFFSET_FOUND_NULL: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.OFFSET_OVERFLOW_ONE: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.OFFSET_OVERFLOW_BADLY: (PullStatus.OFFSET_ILLEGAL, ResponseCode.PULL_OFFSET_MOVED),
    GetStatus.OFFSET_TOO_SMALL: (PullStatus.OFFSET_ILLEGAL, ResponseCode.PULL_OFFSET_MOVED),
}




def _messages_reply(req: Request, found: list[Any], store: Any) -> Response:
    """Found messages travel as their stored record bytes (the client checks and decodes)."""
    records = [r for r in (store.record_at(m.commit_log_offset) for m in found) if r is not None]
    if not records:
        return reply(req, ResponseCode.QUERY_NOT_FOUND, "no message found")
    return reply(req, bodies=records)


def _opaque_of(frames: list[bytes], limits: Limits) -> int:
    """The opaque of a request refused before it was looked at (UNKNOWN_OPAQUE if none)."""
    try:
        return decode_request(frames, limits).opaque
    except ProtocolError as e:
        return e.opaque


def _encode(resp: Response) -> list[bytes]:
    return encode_response(resp.code, resp.opaque, resp.remark, resp.fields, resp.bodies)
