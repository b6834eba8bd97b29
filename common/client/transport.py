"""The client's I/O thread: one connection per broker, requests in flight matched by opaque id,
blocking calls on the calling thread's own socket, and the coalescing of ``send_async``
messages into SEND_BATCH requests (see the package docstring for the whole picture).

The I/O thread's connections: without CURVE keys a plain socket of this thread speaking ZMTP
as a DEALER (``common/format/zmtp_link.py``: what the DEALER did, without libzmq's thread
between a batch and its answer); with keys (or ``plain_calls=False``) a libzmq DEALER. Either
way: nothing is queued for a broker not connected (ZMQ_IMMEDIATE: a call waits in this
thread's backlog for the connection, up to its deadline), a heartbeat every second drops a
connection silent for three, and a connection that drops fails the calls sent on it at once
(ConnectionLostError) while the backlog waits for the next one.

Should the I/O thread die (an exception out of its loop: a bug), it is logged at ERROR
(``event=client_io_thread_died``) and every call waiting on it fails at once with a BrokerError
naming the cause ("the client's I/O thread died"), as does every later call of this client,
blocking ones included: nothing is left waiting for a deadline that no thread would check.
A client in that state is broken for good (``failure``); make a new one.

Blocking calls (``call_sync``) use a DEALER of the calling thread's own, with a monitor. Those
are bounded: each is registered with a weak reference to its thread, the sockets of threads
that have ended are closed (at the next socket made, and by the I/O thread every
``REAP_INTERVAL_S``), and at most ``max_direct_sockets`` exist at once; a thread that finds
the cap reached has its blocking call carried by the I/O thread instead (a Future waited on),
so a pool's thread churn cannot leak descriptors.

``send_async``'s coalescing into SEND_BATCH requests is the accumulator's
(``common/client/accumulator.py``): this thread hands it what other threads queued, sends the
batches it says are ready and tells it their outcomes.

Requests from the broker: a broker may send a request on a connection this thread owns (a
producer's, once its heartbeat told the broker who it is): a transaction check-back, a command.
``serve(code, handler)`` registers what answers a code; the handler runs on the
``replog-client-requests`` thread (never this one), and its answer goes back on the same
connection with the request's opaque. A code nobody serves is answered
REQUEST_CODE_NOT_SUPPORTED, as the broker answers one it does not know.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.client.accumulator import Accumulator, Entry
from common.client.in_process import IN_PROCESS_CODES, InProcess, call_in_process
from common.client.plain_call import PlainConnection
from common.client.results import ClientTimeoutError, ConnectionLostError, HandshakeError
from common.core.errors import BrokerError, ResponseCode
from common.core.futures import LightFuture
from common.core.keys import ClientKeys
from common.format.protocol import (
    Limits,
    ProtocolError,
    Request,
    RequestCode,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_response,
    is_request,
)
from common.format.zmq_frames import POLLIN, POLLOUT, readable, recv_message, send_frames
from common.format.zmtp_link import ZmtpLink

DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_SPIN_US = 300  # call_sync polls without sleeping this long while answers come sooner
MAX_SPIN_BACKOFF = 64  # after spins that missed, at most this many calls in a row do not spin
RECV_BURST = 1024  # messages read from one socket before looking at the others
LOST_CHECK_MS = 100  # a blocking call looks for a dropped connection this often
# a blocking call sent while its socket's connection is down waits this long for a reconnect,
# then ends (ConnectionLostError: retriable, outcome unknown), so a client moves on from a
# killed broker (a failover) in a second, not at the call's deadline
DOWN_WAIT_S = 1.0
MAX_DIRECT_SOCKETS = 64  # blocking-call sockets at once; more threads go through the I/O thread
REAP_INTERVAL_S = 1.0  # the I/O thread closes the sockets of threads that ended this often
HEARTBEAT_S = 1.0  # the I/O thread's connections: an idle one pinged; silent 3 beats: dropped
IO_CALL_GRACE_S = 5.0  # a blocking call carried by the I/O thread: its own deadline, then this
CLIENT_LIMITS = Limits(max_frame_bytes=128 * 1024 * 1024).for_responses()
# blocking calls of a client without CURVE keys over plain sockets speaking ZMTP
# (plain_call.py), not DEALERs; LIBZMQ_CALLS_REPLOG=1 (or plain_calls=False) keeps DEALERs
PLAIN_CALLS = os.environ.get("LIBZMQ_CALLS_REPLOG", "") != "1"
# With CURVE, a socket's monitor also reports failed handshakes (a refused key, a wrong server key)
_HANDSHAKE_FAILURES = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol error",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "cut",
}
_CURVE_EVENTS = int(zmq.EVENT_DISCONNECTED)
for _event in _HANDSHAKE_FAILURES:
    _CURVE_EVENTS |= int(_event)


def _handshake_error(address: str, event: Any) -> HandshakeError:
    kind = event["event"]
    refused = kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    detail = f"ZAP status {event['value']}" if refused else _HANDSHAKE_FAILURES[kind]
    return HandshakeError(address, refused, detail)

log = logging.getLogger("replog.client")


class _Wakeup:
    """A self-pipe the I/O thread polls beside its sockets; any thread may ``wake`` it."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._pending = False
        self._closed = False

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        if self._pending:
            # A byte is in the pipe and the I/O thread has not cleared it yet. It clears before
            # it drains its inbox, so what our caller queued before this call is seen then.
            return
        with self._lock:
            if self._pending or self._closed:
                return  # closed: the descriptors may already belong to another file
            self._pending = True
            try:
                os.write(self._w, b"\x00")
            except BlockingIOError:
                pass  # pipe full: a wake is already pending

    def clear(self) -> None:
        """Empty the pipe, then re-arm: a wake after this writes a fresh byte (none is lost)."""
        with self._lock:
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass
            self._pending = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            os.close(self._r)
            os.close(self._w)


@dataclasses.dataclass(eq=False)
class _Call:
    address: str
    frames: list[bytes]
    future: concurrent.futures.Future[Response]
    timeout_ms: int
    opaque: int = 0
    deadline: float = 0.0
    on_done: Callable[[_Call], None] | None = None  # runs on the I/O thread


@dataclasses.dataclass(frozen=True)
class _Answer:
    """The answer to a broker's request, to send on ``address``'s connection."""

    address: str
    frames: list[bytes]


# a broker's request -> the answer (its opaque is set by the transport), or None: no answer
RequestHandler = Callable[[str, Request], Response | None]


def _outcome(future: concurrent.futures.Future[Response]) -> Response | BrokerError:
    """A settled call's Response, or the BrokerError it failed with."""
    try:
        return future.result()
    except BrokerError as e:
        return e


def new_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]], address: str, blocking_call: bool = False,
    curve: ClientKeys | None = None,
) -> zmq.Socket[bytes]:
    """A DEALER to ``address``.

    The I/O thread's sockets are ZMQ_IMMEDIATE, so no request is queued while the connection
    is down, with heartbeats, so a frozen broker's connection is dropped. But libzmq then also
    drops the answers not yet read when the connection drops (``socket_base_t::hiccuped`` ends
    the pipe without delay), and a broker closes right after its last answers when it drains (a
    test lost 18 of 40 such answers on a loaded VM). A ``blocking_call`` socket (one thread,
    one call at a time) has neither: it keeps such an answer, and ``call_sync`` closes it when
    its call times out, so no stale request outlives the call either. Without heartbeats it
    also stays out of the libzmq assertions on heartbeat timers (libzmq issues 3596, 3937).
    ``curve``: a CURVE client pinning the broker's key (``docs/security.md``).
    """
    sock = ctx.socket(zmq.DEALER)
    if curve is not None:
        try:
            curve.apply(sock, address)
        except BaseException:
            sock.close(linger=0)
            raise
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 0 if blocking_call else 1)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    if not blocking_call:
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
    else:
        sock.setsockopt(zmq.RCVTIMEO, LOST_CHECK_MS)  # call_sync waits in recv this long
    sock.setsockopt(zmq.MAXMSGSIZE, CLIENT_LIMITS.max_frame_bytes)
    sock.connect(f"tcp://{address}")
    return sock


class Transport:
    """The I/O thread, its sockets and the map of requests in flight."""

    def __init__(
        self,
        name: str = "replog-client",
        batch_size: int = 64,
        batch_bytes: int = 1024 * 1024,
        linger_ms: float = 0.0,
        max_batches_in_flight: int = 2,
        max_in_flight: int = 65_536,
        batch_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        spin_us: int = DEFAULT_SPIN_US,
        max_direct_sockets: int = MAX_DIRECT_SOCKETS,
        curve: ClientKeys | None = None,
        in_process: Mapping[str, InProcess] | None = None,
        plain_calls: bool | None = None,
    ):
        self._curve = curve
        # blocking calls on plain sockets (plain_call.py): only without CURVE
        self._plain = curve is None and (PLAIN_CALLS if plain_calls is None else plain_calls)
        self._plain_down: dict[str, float] = {}  # address -> when a plain connection was lost
        # the I/O thread's plain connections (no CURVE): address -> link, and what is polled
        self._links: dict[str, ZmtpLink] = {}
        self._link_fds: dict[int, tuple[str, int]] = {}  # fd -> (address, events) registered
        # brokers of this process: address -> their calls (in_process.py), for call_sync
        self._in_process = dict(in_process or {})
        self._monitor_events = _CURVE_EVENTS if curve is not None else zmq.EVENT_DISCONNECTED
        self._spin_s = max(0, spin_us) / 1e6
        self._rtt_s = 0.0  # moving average of call_sync round trips
        self._spin_skip = 0  # calls left that block at once (after a spin that missed)
        self._spin_backoff = 0  # how many calls the next missed spin skips
        self.on_degraded: Callable[[str], None] | None = None  # set by the cluster view
        self._ctx = zmq.Context(io_threads=1)
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        self._addresses: dict[zmq.Socket[bytes], str] = {}
        self._monitors: dict[zmq.Socket[bytes], str] = {}  # DISCONNECTED events per socket
        self._backlog: dict[str, collections.deque[_Call]] = {}
        self._inbox: collections.deque[_Call | _Answer | Entry] = collections.deque()
        self._wakeup = _Wakeup()
        self._pending: dict[int, _Call] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._opaques = itertools.count(1)
        self._stop = threading.Event()
        self._stopping = False  # set with _stop: a plain read for every submit (is_set is a call)
        # send_async's lanes (common/client/accumulator.py): driven by this transport's thread
        self.batches = Accumulator(self, batch_size, batch_bytes, linger_ms,
                                   max_batches_in_flight, max_in_flight, batch_timeout_ms)
        # requests from the broker: code -> what answers it, on a thread of its own
        self._served: dict[RequestCode, RequestHandler] = {}
        self._serving: concurrent.futures.ThreadPoolExecutor | None = None
        self.failure = ""  # why the I/O thread died ("" while it runs)
        self._local = threading.local()
        # blocking-call socket -> its thread (weakly: a thread that ended is not kept alive)
        self._direct: dict[Any, weakref.ref[threading.Thread]] = {}  # DEALERs or plain
        self._direct_monitors: dict[zmq.Socket[bytes], zmq.Socket[bytes]] = {}
        self._direct_lock = threading.Lock()
        self._max_direct = max(0, max_direct_sockets)
        self._next_reap = time.monotonic() + REAP_INTERVAL_S  # the I/O thread's sweep
        self._poller = zmq.Poller()
        self._poller.register(self._wakeup.fileno(), zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------
    def call(
        self,
        address: str,
        code: RequestCode,
        fields: dict[str, Any] | None = None,
        bodies: Sequence[bytes] = (),
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> concurrent.futures.Future[Response]:
        """Send one request; the future resolves with the Response or a BrokerError."""
        fut: concurrent.futures.Future[Response] = LightFuture()
        opaque = next(self._opaques)  # itertools.count is atomic under the GIL
        frames = encode_request(code, opaque, fields, bodies)
        self._submit(_Call(address, frames, fut, timeout_ms, opaque))
        return fut

    def call_sync(
        self,
        address: str,
        code: RequestCode,
        fields: dict[str, Any] | None = None,
        bodies: Sequence[bytes] = (),
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> Response:
        """A blocking request on the calling thread's own socket to ``address``.

        One request in flight per thread needs no hand-off to the I/O thread (two thread
        switches saved per call); answers to earlier timed-out calls are skipped by opaque.
        """
        if self._stopping:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False)
        if self.failure:
            raise self.dead_error()
        if self._in_process and code in IN_PROCESS_CODES:
            calls = self._in_process.get(address)
            if calls is not None:  # a broker of this process: no socket (in_process.py)
                return call_in_process(calls, address, code, fields, bodies, timeout_ms)
        sock = self._direct_socket(address)
        if sock is None:  # as many blocking-call sockets as allowed: the I/O thread carries it
            return self._call_through_io(address, code, fields, bodies, timeout_ms)
        if isinstance(sock, PlainConnection):
            return self._call_plain(sock, code, fields, bodies, timeout_ms)
        # forget drops before this request: it was not on them; after a failed handshake,
        # try a new connection (libzmq may not retry one a broker's ZAP refused)
        if isinstance(self._connection_dropped(sock, address), HandshakeError):
            self._drop_direct_socket(address, sock)
            again = self._direct_socket(address)
            if again is None:
                return self._call_through_io(address, code, fields, bodies, timeout_ms)
            assert not isinstance(again, PlainConnection)  # only without CURVE, as before
            sock = again
        opaque = next(self._opaques)
        started = time.monotonic()
        deadline = started + timeout_ms / 1000.0
        frames = encode_request(code, opaque, fields, bodies)
        try:
            send_frames(sock, frames)  # no HWM, and queued until connected...
        except zmq.Again:
            # ...unless libzmq already ended the connection's pipe: a failed handshake (a
            # plain client at a CURVE broker, a key the broker's ZAP refused) ends the session
            # for good, with no reconnect, and a DEALER without a pipe cannot queue. Nothing
            # was sent. The monitor's event, written before the pipe ended, names the cause.
            lost = self._connection_dropped(sock, address)
            self._drop_direct_socket(address, sock)
            raise lost if isinstance(lost, HandshakeError) else \
                ConnectionLostError(address) from None
        sent = time.perf_counter()
        if self._spin_s > 0.0 and self._rtt_s < self._spin_s:
            if self._spin_skip > 0:
                self._spin_skip -= 1
            else:
                resp = self._spin_for(sock, opaque, sent + min(self._spin_s, timeout_ms / 1000))
                if resp is not None:
                    self._spin_backoff = 0
                    self._note_rtt(time.perf_counter() - sent)
                    return resp
                # Missed: answers take about the budget (a SYNC put's four hops). A spin that
                # misses burnt a CPU the broker and its slave wanted on a small machine, so
                # the next calls block at once, doubling each miss (an adaptive mutex's
                # back-off); races between threads on these counters are harmless.
                self._spin_backoff = min(MAX_SPIN_BACKOFF, self._spin_backoff * 2 + 1)
                self._spin_skip = self._spin_backoff
        # Wait in recv itself, up to RCVTIMEO (LOST_CHECK_MS, set by new_dealer; shorter for
        # the last wait before the deadline): libzmq sleeps on the socket's mailbox as a plain
        # blocking recv does. A zmq_poll per wait (a Poller built, the socket's FD and events
        # read, the poll) cost ~10-25 us more client CPU a call here (bench/zmq_send_cost.py).
        wait_ms = LOST_CHECK_MS
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                # the request may still wait in the socket for a connection: it goes with it
                self._drop_direct_socket(address, sock)
                raise ClientTimeoutError(address, timeout_ms)
            if left_ms < wait_ms:
                wait_ms = left_ms
                sock.setsockopt(zmq.RCVTIMEO, wait_ms)
            try:
                frames = recv_message(sock, 0)
            except zmq.Again:
                lost = self._connection_dropped(sock, address)
                if not lost and self._is_down(sock) and time.monotonic() - started > DOWN_WAIT_S:
                    lost = True
                if lost:
                    self._drop_direct_socket(address, sock)
                    raise lost if isinstance(lost, HandshakeError) else \
                        ConnectionLostError(address)
                continue
            try:
                resp = decode_response(frames, CLIENT_LIMITS)
            except ProtocolError:
                continue
            if resp.opaque == opaque:
                if wait_ms != LOST_CHECK_MS:  # the socket's next call waits as usual
                    sock.setsockopt(zmq.RCVTIMEO, LOST_CHECK_MS)
                self._note_rtt(time.perf_counter() - sent)
                return resp

    def _call_plain(self, conn: PlainConnection, code: RequestCode,
                    fields: dict[str, Any] | None, bodies: Sequence[bytes],
                    timeout_ms: int) -> Response:
        """``call_sync`` on the calling thread's plain connection (plain_call.py): the same
        outcomes, spinning as the DEALER path spins. A call that fails has closed the
        connection where it must; the next call on it connects anew."""
        opaque = next(self._opaques)
        deadline = time.monotonic() + timeout_ms / 1000.0
        frames = encode_request(code, opaque, fields, bodies)
        conn.send(frames, deadline, self._stop.is_set, timeout_ms)
        sent = time.perf_counter()
        resp = None
        if self._spin_s > 0.0 and self._rtt_s < self._spin_s:
            if self._spin_skip > 0:
                self._spin_skip -= 1
            else:
                resp = self._spin_plain(conn, opaque, sent + min(self._spin_s, timeout_ms / 1000),
                                        deadline, timeout_ms)
                if resp is not None:
                    self._spin_backoff = 0
                else:  # missed: back off, as the DEALER path does (see call_sync)
                    self._spin_backoff = min(MAX_SPIN_BACKOFF, self._spin_backoff * 2 + 1)
                    self._spin_skip = self._spin_backoff
        if resp is None:
            resp = conn.answer(opaque, deadline, timeout_ms)
            assert resp is not None  # blocking: the answer, or raised
        self._rtt_s += (time.perf_counter() - sent - self._rtt_s) / 8.0  # _note_rtt, inline
        return resp

    def _spin_plain(self, conn: PlainConnection, opaque: int, until: float, deadline: float,
                    timeout_ms: int) -> Response | None:
        """``_spin_for`` on a plain connection: reads without sleeping until ``until``."""
        return conn.answer(opaque, deadline, timeout_ms, until)

    def _spin_for(self, sock: zmq.Socket[bytes], opaque: int, until: float) -> Response | None:
        """Poll ``sock`` without sleeping until ``until``: the answer, or None (then block).

        Waking a thread that sleeps in poll() costs tens of microseconds on a VM (often a
        cross-CPU interrupt), as much as a whole loopback round trip; a caller that spins
        for an answer expected within ``spin_us`` skips that wake-up (an adaptive mutex's
        trick). ``call_sync`` spins only while the recent round trips fit in the budget, so a
        slow path (a SYNC_MASTER put, a long poll) costs no CPU, and after a spin that missed
        it skips 1, 3, 7 ... up to MAX_SPIN_BACKOFF calls before it spins again: round trips
        just past the budget would otherwise spin on and off with the moving average."""
        clock = time.perf_counter
        while True:
            if not readable(sock):
                if clock() >= until:
                    return None
                continue
            try:
                frames = recv_message(sock)
            except zmq.Again:
                continue
            try:
                resp = decode_response(frames, CLIENT_LIMITS)
            except ProtocolError:
                continue
            if resp.opaque == opaque:
                return resp

    def _note_rtt(self, seconds: float) -> None:
        """Moving average of ``call_sync`` round trips (races between threads are harmless)."""
        self._rtt_s += (seconds - self._rtt_s) / 8.0

    def _call_through_io(self, address: str, code: RequestCode, fields: dict[str, Any] | None,
                         bodies: Sequence[bytes], timeout_ms: int) -> Response:
        """A blocking call without a socket of the calling thread's own: ``call`` and wait
        (the I/O thread ends it at its deadline; the grace covers a thread that cannot)."""
        fut = self.call(address, code, fields, bodies, timeout_ms)
        try:
            return fut.result(timeout_ms / 1000.0 + IO_CALL_GRACE_S)
        except concurrent.futures.TimeoutError:
            raise ClientTimeoutError(address, timeout_ms) from None

    def _direct_socket(self, address: str) -> zmq.Socket[bytes] | PlainConnection | None:
        """The calling thread's socket to ``address``; None when ``max_direct_sockets`` are
        in use by live threads (the sockets of threads that ended are closed first)."""
        sockets: dict[str, Any] | None = getattr(self._local, "sockets", None)
        if sockets is None:
            sockets = self._local.sockets = {}
        sock = sockets.get(address)
        if sock is None:
            with self._direct_lock:
                if self._stop.is_set():  # close() has run: it would never close this one
                    raise BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False)
                self._reap_direct_locked()
                if len(self._direct) >= self._max_direct:
                    return None
                if self._plain:  # connected by its first call
                    conn = PlainConnection(address, CLIENT_LIMITS, self._plain_down,
                                           DOWN_WAIT_S)
                    self._direct[conn] = weakref.ref(threading.current_thread())
                    sockets[address] = conn
                    return conn
                sock = new_dealer(self._ctx, address, blocking_call=True, curve=self._curve)
                monitor = sock.get_monitor_socket(self._monitor_events
                                                  | zmq.EVENT_HANDSHAKE_SUCCEEDED)
                self._direct[sock] = weakref.ref(threading.current_thread())
                self._direct_monitors[sock] = monitor
            sockets[address] = sock
            self._local.monitors = getattr(self._local, "monitors", {})
            self._local.monitors[sock] = monitor
        return sock

    def _reap_direct_locked(self) -> int:
        """Under ``_direct_lock``: close the blocking-call sockets of threads that ended (no
        other thread uses them: each is its thread's own)."""
        dead = [s for s, owner in self._direct.items()
                if (thread := owner()) is None or not thread.is_alive()]
        for sock in dead:
            del self._direct[sock]
            self._close_direct(sock)
        return len(dead)

    def _connection_dropped(self, sock: zmq.Socket[bytes],
                            address: str) -> bool | HandshakeError:
        """Whether the calling thread's socket ``sock`` lost a connection since last asked
        (with CURVE: the HandshakeError of a failed handshake, which outranks a drop).

        Checked while a blocking call waits (every LOST_CHECK_MS): an answer cannot come over
        a new connection to a request sent on a dropped one (the broker's ROUTER knew the
        peer by that connection), so the call ends with ConnectionLostError rather than at
        its deadline and is retried at once, e.g. on the master found again."""
        monitor = self._local.monitors.get(sock)
        dropped: bool | HandshakeError = False
        # the common case (no event) costs one getsockopt, not a raised zmq.Again: this also
        # runs before every blocking request (1.8 against 3.4 us a call here)
        while monitor is not None and monitor.getsockopt(zmq.EVENTS) & POLLIN:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] in _HANDSHAKE_FAILURES:
                dropped = _handshake_error(address, event)
                self._down(sock, True)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                dropped = dropped or True
                self._down(sock, True)
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._down(sock, False)
        return dropped

    def _down(self, sock: zmq.Socket[bytes], down: bool) -> None:
        downs: set[zmq.Socket[bytes]] = getattr(self._local, "down", None) or set()
        self._local.down = downs
        if down:
            downs.add(sock)
        else:
            downs.discard(sock)

    def _is_down(self, sock: zmq.Socket[bytes]) -> bool:
        """The thread's socket lost its connection and has not made a new one since."""
        downs = getattr(self._local, "down", None)
        return downs is not None and sock in downs

    def _drop_direct_socket(self, address: str, sock: zmq.Socket[bytes]) -> None:
        """Close the calling thread's DEALER to ``address`` (LINGER 0: a request still queued
        for a connection is dropped with it); the next call makes a new one."""
        sockets: dict[str, Any] = self._local.sockets
        if sockets.get(address) is sock:
            del sockets[address]
        self._local.monitors.pop(sock, None)
        self._down(sock, False)
        with self._direct_lock:
            if self._direct.pop(sock, None) is not None:
                self._close_direct(sock)

    def _close_direct(self, sock: Any) -> None:
        """Under ``_direct_lock``: close a blocking-call socket and its monitor."""
        if type(sock) is PlainConnection:
            sock.close()
            return
        monitor = self._direct_monitors.pop(sock, None)
        if monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)

    # -- the accumulator's network (common/client/accumulator.py) -----------------------------
    def start_request(self, address: str, code: RequestCode, fields: dict[str, Any],
                      bodies: list[bytes], timeout_ms: int,
                      done: Callable[[Response | BrokerError], None]) -> None:
        """I/O thread: send a request now; ``done`` gets its outcome on this thread."""
        fut: concurrent.futures.Future[Response] = LightFuture()
        opaque = next(self._opaques)
        call = _Call(address, encode_request(code, opaque, fields, bodies), fut, timeout_ms,
                     opaque)
        call.on_done = lambda c: done(_outcome(c.future))
        self._start_call(call)

    def closing(self) -> bool:
        return self._stop.is_set() or bool(self.failure)

    def degraded(self, address: str) -> None:
        if self.on_degraded is not None:
            self.on_degraded(address)

    # -- requests from the broker ---------------------------------------------------------------
    def serve(self, code: RequestCode, handler: RequestHandler) -> None:
        """Answer the broker's requests of ``code`` with ``handler(address, request)``: a
        Response (its opaque is set here), or None for no answer. Any thread, any time."""
        if self._serving is None:
            self._serving = concurrent.futures.ThreadPoolExecutor(1, "replog-client-requests")
        self._served[code] = handler

    def _on_request(self, address: str, frames: list[bytes]) -> None:
        """I/O thread: a request a broker sent on ``address``'s connection."""
        try:
            req = decode_request(frames, CLIENT_LIMITS)
        except ProtocolError as e:
            self._queue_answer(address, error_response(e))
            return
        handler = self._served.get(req.code)
        if handler is None or self._serving is None:
            self._queue_answer(address, encode_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, req.opaque,
                f"this client serves no {req.code.name} requests"))
            return
        self._serving.submit(self._answer_request, handler, address, req)

    def _answer_request(self, handler: RequestHandler, address: str, req: Request) -> None:
        """The requests thread: run the handler, hand its answer to the I/O thread."""
        try:
            resp = handler(address, req)
        except Exception as e:
            log.exception("event=client_request_handler_failed code=%s", req.code.name)
            resp = Response(ResponseCode.SYSTEM_ERROR, req.opaque, f"client error: {e!r}", {},
                            [])
        if resp is None:
            return
        try:
            self._submit(_Answer(address, encode_response(
                resp.code, req.opaque, resp.remark, resp.fields, resp.bodies)))
        except BrokerError:
            pass  # closed meanwhile: the broker's request times out

    def _queue_answer(self, address: str, frames: list[bytes]) -> None:
        self._inbox.append(_Answer(address, frames))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the I/O thread and close every socket (call once no thread uses the client)."""
        self._stopping = True
        self._stop.set()
        with self._direct_lock:
            for sock in list(self._direct):
                self._close_direct(sock)
            self._direct.clear()
        self._wakeup.wake()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._wakeup.close()
            if self.failure:  # the dead thread left the context: its sockets are closed now
                self._ctx.term()

    def dead_error(self) -> BrokerError:
        """What every call fails with once the I/O thread died."""
        return BrokerError(ResponseCode.SYSTEM_ERROR,
                           f"the client's I/O thread died ({self.failure}); this client fails "
                           "every call from now on: close it and make a new one", False)

    def _submit(self, entry: _Call | _Answer | Entry) -> None:
        """Any thread: hand ``entry`` to the I/O thread (``submit``: an accumulator entry)."""
        if self._stopping:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False)
        self._inbox.append(entry)
        self._wakeup.wake()
        if self.failure:  # no thread reads the inbox: fail it here (the dying one may race)
            self._fail_inbox(self.dead_error())

    submit = _submit  # Network.submit, the same method: a Python call less a send_async

    # -- the I/O thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._loop_once()
        except Exception as e:  # a bug: loud, and nothing may wait on this thread any more
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("event=client_io_thread_died thread=%s error=%r pending=%d",
                          self._thread.name, self.failure, len(self._pending))
        finally:
            err = self.dead_error() if self.failure else BrokerError(
                ResponseCode.SYSTEM_ERROR, "client is closed", False)
            self._fail_all(err)
            for address in list(self._sockets):
                try:
                    self._close_socket(address)
                except Exception:  # a broken thread's state: close what can be
                    log.exception("event=client_socket_close_failed address=%s", address)
            for link in self._links.values():
                link.close()
            if not self.failure:
                self._ctx.term()  # close() closed the blocking-call sockets first

    def _loop_once(self) -> None:
        if self._links:  # connections made or kept, and polled for what each wants now
            self._tend_links(time.monotonic())
        events = dict(self._poller.poll(self._poll_timeout_ms()))
        if self._wakeup.fileno() in events:
            self._wakeup.clear()
        self._drain_inbox()
        for sock, mask in events.items():
            if sock in self._monitors:
                self._on_monitor(sock)
            elif isinstance(sock, zmq.Socket) and sock in self._addresses:
                if mask & POLLIN:
                    self._receive(sock)
                if mask & POLLOUT:
                    self._flush_backlog(self._addresses[sock])
            elif sock in self._link_fds:
                address = self._link_fds[sock][0]
                link = self._links[address]
                for frames in link.on_ready(mask):
                    self._on_frames(address, frames)
                self._link_state(address, link)
        now = time.monotonic()
        self.batches.send_ready(now)
        self._expire(now)
        if now >= self._next_reap:
            self._next_reap = now + REAP_INTERVAL_S
            with self._direct_lock:
                if not self._stop.is_set():
                    self._reap_direct_locked()

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        deadline = self._deadlines[0][0] if self._deadlines else now + 1.0
        deadline = self.batches.next_due(deadline)
        for link in self._links.values():
            wait_s = link.timeout_s(now)
            if wait_s is not None:
                deadline = min(deadline, now + wait_s)
        return max(0, min(1000, int((deadline - time.monotonic()) * 1000) + 1))

    def _drain_inbox(self) -> None:
        while self._inbox:
            entry = self._inbox.popleft()
            if isinstance(entry, _Call):
                self._start_call(entry)
            elif isinstance(entry, _Answer):
                if self._plain:  # not taken (no connection now): the broker's request times out
                    self._link(entry.address).send(entry.frames)
                    continue
                with contextlib.suppress(zmq.Again):  # no connection now: the broker's
                    send_frames(self._socket(entry.address), entry.frames)  # request times out
            else:
                self.batches.add(entry)

    def _socket(self, address: str) -> zmq.Socket[bytes]:
        sock = self._sockets.get(address)
        if sock is None:
            sock = new_dealer(self._ctx, address, curve=self._curve)
            monitor = sock.get_monitor_socket(self._monitor_events)
            self._sockets[address] = sock
            self._addresses[sock] = address
            self._monitors[monitor] = address
            self._poller.register(sock, zmq.POLLIN)
            self._poller.register(monitor, zmq.POLLIN)
        return sock

    # -- the plain connections (no CURVE) --------------------------------------------------------
    def _link(self, address: str) -> ZmtpLink:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = ZmtpLink(
                address, CLIENT_LIMITS.max_batch_count + 2, CLIENT_LIMITS.max_frame_bytes,
                queue_first=False, heartbeat_s=HEARTBEAT_S)
            link.tick(time.monotonic())  # polled from the next turn on (_loop_once)
        return link

    def _tend_links(self, now: float) -> None:
        """Before each poll: connections due are made, heartbeats kept, what happened acted
        on, and the poller told which descriptors to watch for what (closed ones first: a
        number may be reused by a new socket)."""
        for address, link in list(self._links.items()):  # acting may make a link: ticked
            link.tick(now)                                  # as it is made, polled below
            if link.lost or link.just_connected or link.failure:
                self._link_state(address, link)
        wanted: dict[int, tuple[str, int]] = {}
        for address, link in self._links.items():
            fd = link.fileno()
            if fd is not None:
                wanted[fd] = (address, link.events())
        registered = self._link_fds
        if wanted == registered:
            return
        for fd in [fd for fd in registered if fd not in wanted]:
            with contextlib.suppress(KeyError):
                self._poller.unregister(fd)
            del registered[fd]
        for fd, item in wanted.items():
            if registered.get(fd) != item:
                self._poller.register(fd, item[1])
                registered[fd] = item

    def _link_state(self, address: str, link: ZmtpLink) -> None:
        """What a link's turn found beside answers: a refused handshake (the broker speaks
        CURVE), a lost connection, an answer past the bounds, a new connection."""
        if link.oversized:  # an answer this client cannot read: as a DEALER's MAXMSGSIZE
            link.oversized.clear()
            link.reset("an answer past the client's bounds")
        if link.failure:  # the link tries again by itself; every call to it fails now
            err = HandshakeError(address, False, link.failure)
            link.failure = ""
            self._fail_every_call(address, err)
        if link.lost:
            link.lost = ""
            self._fail_sent(address)
        if link.just_connected:
            link.just_connected = False
            self._flush_backlog(address)
        elif self._backlog.get(address) and link.writable:
            self._flush_backlog(address)

    def _close_socket(self, address: str) -> None:
        sock = self._sockets.pop(address)
        del self._addresses[sock]
        self._poller.unregister(sock)
        for monitor, owner in list(self._monitors.items()):
            if owner == address:
                del self._monitors[monitor]
                self._poller.unregister(monitor)
                with contextlib.suppress(zmq.ZMQError):
                    sock.disable_monitor()
                monitor.close(linger=0)
        sock.close(linger=0)

    def _on_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        lost = False
        failed: HandshakeError | None = None
        address = self._monitors[monitor]
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] in _HANDSHAKE_FAILURES:
                failed = _handshake_error(address, event)
            lost = lost or event["event"] == zmq.EVENT_DISCONNECTED
        if failed is not None:
            self._handshake_failed(address, failed)
        elif lost:
            self._connection_lost(address)

    def _handshake_failed(self, address: str, err: HandshakeError) -> None:
        """No request to ``address`` can go through: fail them all now (sent or waiting in
        the backlog) with ``err``; the next call makes a new socket, hence a new attempt."""
        self._close_socket(address)
        self._fail_every_call(address, err)

    def _fail_every_call(self, address: str, err: BrokerError) -> None:
        """Every call to ``address``, sent or in the backlog, ends with ``err``."""
        self._backlog.pop(address, None)  # its calls are pending too: failed below
        calls = [c for c in self._pending.values() if c.address == address]
        for call in calls:
            del self._pending[call.opaque]
        for call in calls:
            self._finish(call, err)

    def _connection_lost(self, address: str) -> None:
        """The connection to ``address`` dropped: every request sent on it is unanswerable.

        The answers still readable are taken first; then the socket is replaced by a new one
        (so no request can ride a connection libzmq made again meanwhile and be failed here
        although it may be answered), and the calls that went out on the old one end with
        ConnectionLostError at once instead of at their deadline: a send_async batch is retried
        on the master found again, Kafka's producer's behaviour on a broken connection. Calls
        still waiting in the backlog were never sent; they wait for the new connection."""
        sock = self._sockets[address]
        self._receive(sock)
        self._close_socket(address)
        if self._backlog.get(address):
            self._poller.modify(self._socket(address), zmq.POLLIN | zmq.POLLOUT)
        self._fail_sent(address)

    def _fail_sent(self, address: str) -> None:
        """The connection to ``address`` dropped: the calls sent on it end with
        ConnectionLostError; those in the backlog were never sent and wait."""
        waiting = {call.opaque for call in self._backlog.get(address) or ()}
        sent = [
            call
            for call in self._pending.values()
            if call.address == address and call.opaque not in waiting
        ]
        for call in sent:
            del self._pending[call.opaque]
        for call in sent:
            self._finish(call, ConnectionLostError(address))

    def _start_call(self, call: _Call) -> None:
        call.deadline = time.monotonic() + call.timeout_ms / 1000.0
        self._pending[call.opaque] = call
        heapq.heappush(self._deadlines, (call.deadline, call.opaque))
        backlog = self._backlog.get(call.address)
        if backlog:
            backlog.append(call)
            return
        if not self._try_send(call):
            self._park(call)

    def _try_send(self, call: _Call) -> bool:
        if self._plain:
            return self._link(call.address).send(call.frames)
        try:
            send_frames(self._socket(call.address), call.frames)
            return True
        except zmq.Again:
            return False

    def _park(self, call: _Call) -> None:
        """No connection yet: wait for POLLOUT (bounded by the call's deadline)."""
        self._backlog.setdefault(call.address, collections.deque()).append(call)
        if not self._plain:  # a link's connection or room flushes it (_link_state)
            self._poller.modify(self._socket(call.address), zmq.POLLIN | zmq.POLLOUT)

    def _flush_backlog(self, address: str) -> None:
        backlog = self._backlog.get(address)
        while backlog:
            call = backlog[0]
            if call.opaque in self._pending and not self._try_send(call):
                return
            backlog.popleft()
        if not self._plain:
            self._poller.modify(self._sockets[address], zmq.POLLIN)

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        for _ in range(RECV_BURST):
            if not readable(sock):
                return
            try:
                frames = recv_message(sock)
            except zmq.Again:
                return
            self._on_frames(self._addresses[sock], frames)

    def _on_frames(self, address: str, frames: list[bytes]) -> None:
        """A message from ``address``: an answer to a call in flight, or a broker's request."""
        if is_request(frames):
            self._on_request(address, frames)
            return
        try:
            resp = decode_response(frames, CLIENT_LIMITS)
        except ProtocolError:
            return  # unmatched garbage; the request it answers will time out
        call = self._pending.pop(resp.opaque, None)
        if call is not None:
            self._finish(call, resp)

    def _finish(self, call: _Call, outcome: Response | BaseException) -> None:
        if isinstance(outcome, BaseException):
            call.future.set_exception(outcome)
        else:
            call.future.set_result(outcome)
        if call.on_done is not None:
            call.on_done(call)

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, opaque = heapq.heappop(self._deadlines)
            call = self._pending.pop(opaque, None)
            if call is not None:
                self._finish(call, ClientTimeoutError(call.address, call.timeout_ms))
        if not self._pending:
            self._deadlines.clear()

    def _fail_all(self, err: BrokerError) -> None:
        """The thread ends: fail what waits in the inbox, in flight and in the batches (no
        socket is touched: after a failure their state is not to be trusted)."""
        self._fail_inbox(err)
        pending, self._pending = list(self._pending.values()), {}
        for call in pending:
            try:
                self._finish(call, err)
            except Exception:  # the next one must still be failed
                log.exception("event=client_call_fail_failed")
        self.batches.fail_all(err)

    def _fail_inbox(self, err: BrokerError) -> None:
        """Fail what waits in the inbox (the I/O thread's end, or a submit after it)."""
        while True:
            try:
                entry = self._inbox.popleft()
            except IndexError:
                return
            if isinstance(entry, _Call):
                if not entry.future.done():
                    entry.future.set_exception(err)
            elif not isinstance(entry, _Answer):
                self.batches.fail(entry, err)
