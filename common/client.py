"""Python clients: Producer, Consumer and Admin (CONTRACT section 4).

Threads and sockets::

    user threads --(inbox deque + pipe wakeup)--> one I/O thread per client --DEALER--> brokers
                 <---------- concurrent.futures.Future resolved by the I/O thread ----------

* One background I/O thread owns a ZeroMQ context and one DEALER socket per broker address. Any
  number of requests are in flight on a socket at once; answers are matched by their opaque id.
  Sockets use ``ZMQ_IMMEDIATE`` so a request is never parked for a broker that is down (it waits
  in a bounded backlog until the connection is up or its deadline passes) and heartbeats so a
  frozen broker is noticed. (libzmq drops an IMMEDIATE socket's unread answers when its
  connection drops; a draining broker keeps its connections open a moment after its last
  answers for that, see ``common/server.py``.)
* A blocking call (``send``, ``send_batch``, ``pull``, ``status``...) runs on the calling
  thread's own socket (not IMMEDIATE, so an answer that arrives just before the broker closes
  is kept; no heartbeats, the call's deadline is enough; a call that times out closes the
  socket, and a request still waiting in it for a connection goes with it) and first polls
  for its answer without sleeping, up to ``spin_us`` (default 300 us), while recent answers
  have come that fast: waking a sleeping thread costs about as much as a loopback round trip
  on a VM. Slow answers (a SYNC_MASTER put, a long poll) turn this off by themselves;
  ``spin_us=0`` turns it off for good.
* Every request has a deadline (``timeout_ms``, default 10 s: longer than the broker's
  ``slaveTimeout`` and ``syncFlushTimeout`` so FLUSH_SLAVE_TIMEOUT and FLUSH_DISK_TIMEOUT reach the
  caller). A missed deadline raises ``ClientTimeoutError`` (a retriable ``BrokerError``; the send's
  outcome is unknown).
* Master discovery: the client asks every configured broker for its status and writes to the
  master with the highest epoch; a timeout or SERVICE_NOT_AVAILABLE / STALE_EPOCH answer drops
  the cached master so the next attempt discovers again.
* ``Producer.send_async`` coalesces like Kafka's producer: messages for the same queue
  accumulate while that queue has batches in flight (at most ``max_batches_in_flight`` per
  queue, default 2: while one batch waits for its answer, for a SYNC_MASTER the slave's ack, the
  next one is already being stored) and leave as one SEND_BATCH of at most ``batch_size``
  messages, or after ``linger_ms``. A queue's batches travel on one socket to one broker, which
  stores them in the order sent, so a queue keeps its order; a batch that fails and is retried
  lands after what was sent meanwhile (with any setting, as in Kafka without idempotence).
  Retries (only of errors marked retriable, at most ``retries``, with backoff) run on one small
  retry thread, never on the I/O thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import heapq
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.config import split_addresses
from common.errors import BrokerError, CorruptMessageError, PullStatus, ResponseCode, SendStatus
from common.futures import LightFuture
from common.message import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_SHARDING_KEY,
    Message,
    MessageExt,
    java_hash,
)
from common.protocol import (
    Limits,
    ProtocolError,
    RequestCode,
    Response,
    decode_record,
    decode_response,
    encode_request,
)
from common.store import record
from common.zmq_frames import POLLIN, POLLOUT, readable, send_frames

DEFAULT_TIMEOUT_MS = 10_000
DISCOVERY_TIMEOUT_MS = 2_000
ROUTE_TTL_MS = 30_000  # a topic's queue count is asked again after this (RocketMQ's 30 s)
DEFAULT_SPIN_US = 300  # call_sync polls without sleeping this long while answers come sooner
MAX_BACKOFF_S = 1.0
NO_MASTER_PAUSE_S = 0.05  # between discoveries that found no master (each waits for answers)
RECV_BURST = 1024  # messages read from one socket before looking at the others
LOST_CHECK_MS = 100  # a blocking call looks for a dropped connection this often
CLIENT_LIMITS = Limits(max_frame_bytes=128 * 1024 * 1024).for_responses()

SEND_CODES = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
PULL_CODES = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}
# Answers after which the cached master is no longer trusted.
# Answers meaning "stored, but no slave confirmed it": a reason to ask the group again who leads.
DEGRADED_CODES = frozenset({ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE})
REDISCOVER_CODES = frozenset(
    {ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.STALE_EPOCH, ResponseCode.SYSTEM_ERROR}
)


class ClientTimeoutError(BrokerError):
    """No answer within the deadline: the outcome of a write is unknown (retriable)."""

    def __init__(self, address: str, timeout_ms: int):
        super().__init__(
            ResponseCode.SYSTEM_ERROR, f"no answer from {address} within {timeout_ms} ms", True
        )
        self.address = address


class ConnectionLostError(ClientTimeoutError):
    """The connection a request went out on dropped before its answer came: no answer can come
    any more (libzmq discards what an IMMEDIATE socket's dropped connection held), so the call
    ends now rather than at its deadline. The outcome of a write is unknown (retriable)."""

    def __init__(self, address: str):
        BrokerError.__init__(
            self,
            ResponseCode.SYSTEM_ERROR,
            f"connection to {address} lost before the answer came (outcome unknown)",
            True,
        )
        self.address = address


class NoMasterError(BrokerError):
    """No broker of the group answers as master (SERVICE_NOT_AVAILABLE, retriable). While a
    master restarts or a slave is being promoted, sends wait for one up to their ``timeout_ms``
    without using up their retries (as Kafka's producer waits for a partition leader)."""

    def __init__(self, servers: Sequence[str]):
        super().__init__(
            ResponseCode.SERVICE_NOT_AVAILABLE, f"no master answers among {', '.join(servers)}", True
        )


# ---- results --------------------------------------------------------------------------------


class SendResult(NamedTuple):
    """One message's outcome (immutable; a tuple, so that a batch of them is cheap to make)."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    topic: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "msgId": self.msg_id,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset,
        }


@dataclasses.dataclass(frozen=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "nextBeginOffset": self.next_begin_offset,
            "minOffset": self.min_offset,
            "maxOffset": self.max_offset,
            "messages": [m.to_json() for m in self.messages],
        }


def shard_queue(shard_key: str, queue_nums: int) -> int:
    """The queue of a sharding key: RocketMQ's ``SelectMessageQueueByHash`` (the key's Java
    ``hashCode``, made non-negative, modulo the queue count), so a Java producer of the same
    topic sends the key to the same queue. A topic that gains queues moves keys, as in Kafka."""
    return abs(java_hash(shard_key)) % queue_nums


def _with_shard_key(properties: dict[str, str] | None, shard_key: str | None,
                    queue_id: int | None) -> dict[str, str] | None:
    """The properties with ``__SHARDINGKEY`` (RocketMQ 5's name) when a key is given."""
    if shard_key is None:
        return properties
    if queue_id is not None:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                          "give queue_id or shard_key, not both", False)
    if not shard_key:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "empty shard_key", False)
    return {**(properties or {}), PROPERTY_SHARDING_KEY: shard_key}


def send_results(topic: str, resp: Response) -> list[SendResult]:
    """A SEND / SEND_BATCH answer -> one SendResult per message (raises if refused).

    The answer carries the store host's msgId prefix (``storeHost``) and each record's CommitLog
    offset (``offsets``, or ``commitLogOffset`` alone for one record); each msgId is that prefix
    and the offset in 16 hex digits (RocketMQ's offsetMsgId).
    """
    status = SEND_CODES.get(resp.code)
    if status is None:
        raise BrokerError(resp.code, resp.remark)
    fields = resp.fields
    prefix = fields.get("storeHost")
    first_phy = fields.get("commitLogOffset")
    offsets = fields.get("offsets") or ([first_phy] if first_phy is not None else [])
    if (type(prefix) is not str or len(prefix) != 16 or not set(map(type, offsets)) <= {int}
            or not 0 <= min(offsets, default=0) <= max(offsets, default=0) < 1 << 63):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"malformed send answer {fields!r:.200}")
    queue_id = int(fields.get("queueId", -1))
    first = int(fields.get("queueOffset", -1))
    make = tuple.__new__  # SendResult's fields in order, without its Python-level __new__
    cls = SendResult
    if len(offsets) < 8:
        ids = [f"{prefix}{phy:016X}" for phy in offsets]
    else:  # one hex conversion for the whole batch, cut in 16 digits per id
        digits = struct.pack(f">{len(offsets)}Q", *offsets).hex().upper()
        ids = [prefix + digits[i : i + 16] for i in range(0, len(digits), 16)]
    return [
        make(cls, (status, msg_id, queue_id, first + i, phy, topic))
        for i, (msg_id, phy) in enumerate(zip(ids, offsets, strict=True))
    ]


def pack_bodies(fields: dict[str, Any], bodies: list[bytes]) -> list[bytes]:
    """A SEND_BATCH's bodies back to back in one frame, their lengths in ``fields["sizes"]``
    (one frame instead of one per message: each frame costs a library call on both sides)."""
    fields["sizes"] = [len(b) for b in bodies]
    return [b"".join(bodies)]


def pull_result(resp: Response) -> PullResult:
    """A PULL answer -> PullResult. A record that fails its checks (here: the CRCs; on the
    broker: where the queue entry leads) ends the messages before it; when it is the first,
    CorruptMessageError names its queue offset, so a consumer can decide to skip it."""
    f = resp.fields
    status = PULL_CODES.get(resp.code)
    if status is None:
        if "corruptQueueOffset" in f:
            raise CorruptMessageError(int(f["corruptQueueOffset"]),
                                      int(f.get("corruptCommitLogOffset", -1)), resp.remark)
        raise BrokerError(resp.code, resp.remark)
    messages = []
    next_begin = int(f.get("nextBeginOffset", 0))
    for raw in resp.bodies:
        try:
            messages.append(decode_record(raw))
        except ProtocolError as e:
            queue_offset, phy = (
                _RECORD_OFFSETS.unpack_from(raw, record.POS_QUEUE_OFFSET)
                if len(raw) >= record.POS_PHY_OFFSET + 8 else (-1, -1))
            if not messages:
                raise CorruptMessageError(queue_offset, phy, e.reason) from None
            next_begin = messages[-1].queue_offset + 1  # the next pull meets it first
            break
    return PullResult(
        status,
        next_begin,
        int(f.get("minOffset", 0)),
        int(f.get("maxOffset", 0)),
        messages,
    )


_RECORD_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET (adjacent)


# ---- the I/O thread -------------------------------------------------------------------------


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


@dataclasses.dataclass(eq=False, slots=True)
class _Item:
    """One message waiting to be coalesced into a batch (its future is the caller's)."""

    address: str
    topic: str
    queue_id: int
    body: bytes
    meta: list[Any] | None
    future: concurrent.futures.Future[SendResult]
    enqueued: float
    fixed_queue: int | None = None  # the queue the caller asked for, if any
    attempt: int = 0
    on_error: Callable[[_Item, BrokerError], None] | None = None  # runs on the I/O thread
    give_up: float = 0.0  # monotonic: when waiting for a master (NoMasterError) ends


@dataclasses.dataclass(eq=False)
class _QueueBatch:
    items: collections.deque[_Item] = dataclasses.field(default_factory=collections.deque)
    in_flight: int = 0


def _new_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]], address: str, blocking_call: bool = False
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
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 0 if blocking_call else 1)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    if not blocking_call:
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
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
    ):
        self._batch_timeout_ms = batch_timeout_ms
        self._spin_s = max(0, spin_us) / 1e6
        self._rtt_s = 0.0  # moving average of call_sync round trips
        self.on_degraded: Callable[[str], None] | None = None  # set by the cluster view
        self._ctx = zmq.Context(io_threads=1)
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        self._addresses: dict[zmq.Socket[bytes], str] = {}
        self._monitors: dict[zmq.Socket[bytes], str] = {}  # DISCONNECTED events per socket
        self._backlog: dict[str, collections.deque[_Call]] = {}
        self._inbox: collections.deque[_Call | _Item] = collections.deque()
        self._wakeup = _Wakeup()
        self._pending: dict[int, _Call] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._opaques = itertools.count(1)
        self._batches: dict[tuple[str, str, int], _QueueBatch] = {}
        self._ready: set[tuple[str, str, int]] = set()
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes
        self._linger_s = linger_ms / 1000.0
        self._max_batches = max_batches_in_flight
        self._max_pending = max_in_flight
        self._pending_items = 0
        self._pending_lock = threading.Lock()
        self._pending_freed = threading.Condition(self._pending_lock)
        self._stop = threading.Event()
        self._local = threading.local()
        self._direct: list[zmq.Socket[bytes]] = []
        self._direct_monitors: dict[zmq.Socket[bytes], zmq.Socket[bytes]] = {}
        self._direct_lock = threading.Lock()
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
        if self._stop.is_set():
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False)
        sock = self._direct_socket(address)
        self._connection_dropped(sock)  # forget drops before this request: it was not on them
        opaque = next(self._opaques)
        deadline = time.monotonic() + timeout_ms / 1000.0
        frames = encode_request(code, opaque, fields, bodies)
        send_frames(sock, frames)  # never Again: no HWM, and queued until connected
        sent = time.perf_counter()
        if self._spin_s > 0.0 and self._rtt_s < self._spin_s:
            resp = self._spin_for(sock, opaque, sent + min(self._spin_s, timeout_ms / 1000))
            if resp is not None:
                self._note_rtt(time.perf_counter() - sent)
                return resp
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                # the request may still wait in the socket for a connection: it goes with it
                self._drop_direct_socket(address, sock)
                raise ClientTimeoutError(address, timeout_ms)
            if not sock.poll(min(left_ms, LOST_CHECK_MS)):
                if self._connection_dropped(sock):
                    self._drop_direct_socket(address, sock)
                    raise ConnectionLostError(address)
                continue
            try:
                resp = decode_response(sock.recv_multipart(), CLIENT_LIMITS)
            except ProtocolError:
                continue
            if resp.opaque == opaque:
                self._note_rtt(time.perf_counter() - sent)
                return resp

    def _spin_for(self, sock: zmq.Socket[bytes], opaque: int, until: float) -> Response | None:
        """Poll ``sock`` without sleeping until ``until``: the answer, or None (then block).

        Waking a thread that sleeps in poll() costs tens of microseconds on a VM (often a
        cross-CPU interrupt), as much as a whole loopback round trip; a caller that spins
        for an answer expected within ``spin_us`` skips that wake-up (an adaptive mutex's
        trick). ``call_sync`` spins only while the recent round trips fit in the budget, so a
        slow path (a SYNC_MASTER put, a long poll) costs no CPU."""
        clock = time.perf_counter
        while True:
            if not readable(sock):
                if clock() >= until:
                    return None
                continue
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
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

    def _direct_socket(self, address: str) -> zmq.Socket[bytes]:
        sockets: dict[str, zmq.Socket[bytes]] | None = getattr(self._local, "sockets", None)
        if sockets is None:
            sockets = self._local.sockets = {}
        sock = sockets.get(address)
        if sock is None:
            with self._direct_lock:
                if self._stop.is_set():  # close() has run: it would never close this one
                    raise BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False)
                sock = _new_dealer(self._ctx, address, blocking_call=True)
                monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                self._direct.append(sock)
                self._direct_monitors[sock] = monitor
            sockets[address] = sock
            self._local.monitors = getattr(self._local, "monitors", {})
            self._local.monitors[sock] = monitor
        return sock

    def _connection_dropped(self, sock: zmq.Socket[bytes]) -> bool:
        """Whether the calling thread's socket ``sock`` lost a connection since last asked.

        Checked while a blocking call waits (every LOST_CHECK_MS): an answer cannot come over
        a new connection to a request sent on a dropped one (the broker's ROUTER knew the
        peer by that connection), so the call ends with ConnectionLostError rather than at
        its deadline and is retried at once, e.g. on the master found again."""
        monitor = self._local.monitors.get(sock)
        dropped = False
        # the common case (no event) costs one getsockopt, not a raised zmq.Again: this also
        # runs before every blocking request (1.8 against 3.4 us a call here)
        while monitor is not None and monitor.getsockopt(zmq.EVENTS) & POLLIN:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            dropped = dropped or event["event"] == zmq.EVENT_DISCONNECTED
        return dropped

    def _drop_direct_socket(self, address: str, sock: zmq.Socket[bytes]) -> None:
        """Close the calling thread's socket to ``address`` (LINGER 0: a request still queued
        for a connection is dropped with it); the next call makes a new one."""
        sockets: dict[str, zmq.Socket[bytes]] = self._local.sockets
        if sockets.get(address) is sock:
            del sockets[address]
        self._local.monitors.pop(sock, None)
        with self._direct_lock:
            if sock in self._direct:
                self._direct.remove(sock)
                self._close_direct(sock)

    def _close_direct(self, sock: zmq.Socket[bytes]) -> None:
        """Under ``_direct_lock``: close a blocking-call socket and its monitor."""
        monitor = self._direct_monitors.pop(sock, None)
        if monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)

    def reserve(self, timeout_ms: int) -> None:
        """Take a pending-message slot for a send_async (blocks while too many messages are
        pending, at most ``timeout_ms``); ``requeue`` hands the message over, and the slot is
        freed when its future is settled."""
        with self._pending_lock:
            if self._pending_items >= self._max_pending:
                limit = time.monotonic() + timeout_ms / 1000.0
                while self._pending_items >= self._max_pending:
                    left = limit - time.monotonic()
                    if left <= 0:
                        raise BrokerError(
                            ResponseCode.SYSTEM_BUSY, "client has too many sends pending", True
                        )
                    self._pending_freed.wait(left)
            self._pending_items += 1

    def requeue(self, item: _Item) -> None:
        """A message goes to the coalescing accumulator (its pending slot is held)."""
        self._submit(item)

    def _release_items(self, count: int) -> None:
        with self._pending_lock:
            self._pending_items -= count
            if self._pending_items < self._max_pending:
                self._pending_freed.notify_all()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the I/O thread and close every socket (call once no thread uses the client)."""
        self._stop.set()
        with self._direct_lock:
            for sock in self._direct:
                self._close_direct(sock)
            self._direct.clear()
        self._wakeup.wake()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._wakeup.close()

    def _submit(self, entry: _Call | _Item) -> None:
        if self._stop.is_set():
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False)
        self._inbox.append(entry)
        self._wakeup.wake()

    # -- the I/O thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._loop_once()
        finally:
            self._fail_all(BrokerError(ResponseCode.SYSTEM_ERROR, "client is closed", False))
            for address in list(self._sockets):
                self._close_socket(address)
            self._ctx.term()

    def _loop_once(self) -> None:
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
        now = time.monotonic()
        self._send_ready_batches(now)
        self._expire(now)

    def _poll_timeout_ms(self) -> int:
        deadline = self._deadlines[0][0] if self._deadlines else time.monotonic() + 1.0
        if self._linger_s > 0:
            for key in self._ready:
                batch = self._batches[key]
                if batch.items and batch.in_flight < self._max_batches:
                    deadline = min(deadline, batch.items[0].enqueued + self._linger_s)
        return max(0, min(1000, int((deadline - time.monotonic()) * 1000) + 1))

    def _drain_inbox(self) -> None:
        while self._inbox:
            entry = self._inbox.popleft()
            if isinstance(entry, _Call):
                self._start_call(entry)
            else:
                key = (entry.address, entry.topic, entry.queue_id)
                batch = self._batches.get(key)
                if batch is None:
                    batch = self._batches[key] = _QueueBatch()
                batch.items.append(entry)
                self._ready.add(key)

    def _socket(self, address: str) -> zmq.Socket[bytes]:
        sock = self._sockets.get(address)
        if sock is None:
            sock = _new_dealer(self._ctx, address)
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._sockets[address] = sock
            self._addresses[sock] = address
            self._monitors[monitor] = address
            self._poller.register(sock, zmq.POLLIN)
            self._poller.register(monitor, zmq.POLLIN)
        return sock

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
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            lost = lost or event["event"] == zmq.EVENT_DISCONNECTED
        if lost:
            self._connection_lost(self._monitors[monitor])

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
        backlog = self._backlog.get(address) or ()
        waiting = {call.opaque for call in backlog}
        sent = [
            call
            for call in self._pending.values()
            if call.address == address and call.opaque not in waiting
        ]
        for call in sent:
            del self._pending[call.opaque]
        if backlog:
            self._poller.modify(self._socket(address), zmq.POLLIN | zmq.POLLOUT)
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
        try:
            send_frames(self._socket(call.address), call.frames)
            return True
        except zmq.Again:
            return False

    def _park(self, call: _Call) -> None:
        """No connection yet: wait for POLLOUT (bounded by the call's deadline)."""
        self._backlog.setdefault(call.address, collections.deque()).append(call)
        self._poller.modify(self._socket(call.address), zmq.POLLIN | zmq.POLLOUT)

    def _flush_backlog(self, address: str) -> None:
        backlog = self._backlog.get(address)
        while backlog:
            call = backlog[0]
            if call.opaque in self._pending and not self._try_send(call):
                return
            backlog.popleft()
        self._poller.modify(self._sockets[address], zmq.POLLIN)

    def _receive(self, sock: zmq.Socket[bytes]) -> None:
        for _ in range(RECV_BURST):
            if not readable(sock):
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                resp = decode_response(frames, CLIENT_LIMITS)
            except ProtocolError:
                continue  # unmatched garbage; the request it answers will time out
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
        self._drain_inbox()
        for call in list(self._pending.values()):
            self._finish(call, err)
        self._pending.clear()
        for batch in self._batches.values():
            while batch.items:
                item = batch.items.popleft()
                if not item.future.done():
                    item.future.set_exception(err)
                self._release_items(1)

    # -- coalescing ---------------------------------------------------------------------------
    def _send_ready_batches(self, now: float) -> None:
        for key in list(self._ready):
            batch = self._batches[key]
            while batch.items and batch.in_flight < self._max_batches:
                full = len(batch.items) >= self._batch_size
                if not full and now - batch.items[0].enqueued < self._linger_s:
                    break
                self._send_batch(key, batch)
            if not batch.items:
                self._ready.discard(key)

    def _send_batch(self, key: tuple[str, str, int], batch: _QueueBatch) -> None:
        items: list[_Item] = []
        size = 0
        while batch.items and len(items) < self._batch_size:
            nxt = batch.items[0]
            if items and size + len(nxt.body) > self._batch_bytes:
                break
            items.append(batch.items.popleft())
            size += len(nxt.body)
        address, topic, queue_id = key
        fields: dict[str, Any] = {"topic": topic, "queueId": queue_id}
        if any(i.meta is not None for i in items):
            fields["meta"] = [i.meta for i in items]
        code = RequestCode.SEND_BATCH
        fut: concurrent.futures.Future[Response] = LightFuture()
        opaque = next(self._opaques)
        frames = encode_request(code, opaque, fields, pack_bodies(fields, [i.body for i in items]))
        call = _Call(address, frames, fut, self._batch_timeout_ms, opaque)
        call.on_done = lambda c: self._batch_done(key, batch, items, c)
        batch.in_flight += 1
        self._start_call(call)

    def _batch_done(
        self, key: tuple[str, str, int], batch: _QueueBatch, items: list[_Item], call: _Call
    ) -> None:
        batch.in_flight -= 1
        if batch.items:
            self._ready.add(key)
        try:
            resp = call.future.result()
            if resp.code in DEGRADED_CODES and self.on_degraded is not None:
                self.on_degraded(call.address)
            results = send_results(key[1], resp)
            if len(results) != len(items):
                raise BrokerError(
                    ResponseCode.SYSTEM_ERROR,
                    f"broker answered {len(results)} offsets for {len(items)} messages",
                )
        except BrokerError as e:
            self._items_failed(items, e)
            return
        self._release_items(len(items))
        for item, result in zip(items, results, strict=True):
            item.future.set_result(result)

    def _items_failed(self, items: list[_Item], err: BrokerError) -> None:
        finished = 0
        for item in items:
            if item.on_error is None or self._stop.is_set():
                item.future.set_exception(err)
                finished += 1
            else:
                item.on_error(item, err)  # retries or fails it (and then calls release_one)
        self._release_items(finished)

    def release_one(self) -> None:
        self._release_items(1)


# ---- the cluster view: discovery and routes ---------------------------------------------------


def parse_servers(servers: str | Iterable[str]) -> list[str]:
    try:
        return split_addresses(servers)
    except ValueError as e:
        raise BrokerError(ResponseCode.BAD_REQUEST, str(e), False) from None


class _Cluster:
    """Which broker of the group is the master, and the queue count of each topic.

    ``_lock`` guards the fields and is never held while waiting for anything: ``forget`` and
    ``recheck`` run on the I/O thread too (a failed batch, a degraded answer), and a discovery
    that held it while waiting for that thread to answer its STATUS calls would deadlock it.
    Discoveries take turns on ``_discovering``, which the I/O thread never takes."""

    def __init__(self, transport: Transport, servers: list[str], timeout_ms: int,
                 route_ttl_ms: int = ROUTE_TTL_MS):
        self.transport = transport
        self.servers = servers
        self.timeout_ms = timeout_ms
        self.route_ttl_s = route_ttl_ms / 1000.0
        self._lock = threading.Lock()
        self._discovering = threading.Lock()
        self._generation = 0  # bumped by every forget: a discovery begun before is not cached
        self._master: str | None = None
        self._routes: dict[str, tuple[int, float]] = {}  # topic -> (queue count, asked at)
        self._rechecked: dict[str, float] = {}
        transport.on_degraded = self.recheck

    def status(self, address: str, timeout_ms: int | None = None) -> dict[str, Any]:
        resp = self.request(address, RequestCode.STATUS, timeout_ms=timeout_ms)
        return dict(resp.fields)

    def request(
        self,
        address: str,
        code: RequestCode,
        fields: dict[str, Any] | None = None,
        bodies: Sequence[bytes] = (),
        timeout_ms: int | None = None,
    ) -> Response:
        timeout = timeout_ms or self.timeout_ms
        resp = self.transport.call_sync(address, code, fields, bodies, timeout)
        if resp.code in DEGRADED_CODES:
            self.recheck(address)
        return resp

    def recheck(self, address: str) -> None:
        """The master answered as if cut off from its slaves: it may have been replaced by a
        newer term (a resumed zombie master answers exactly so). Re-discover on the next call,
        at most once a second per address (a SYNC master whose slave is down answers this to
        every put)."""
        now = time.monotonic()
        with self._lock:
            if self._master != address or now - self._rechecked.get(address, 0.0) < 1.0:
                return
            self._rechecked[address] = now
            self._master = None
            self._generation += 1

    def master(self) -> str:
        master = self._master  # the common case needs no lock: a str is read whole
        if master is not None:
            return master
        with self._discovering:
            with self._lock:
                if self._master is not None:
                    return self._master
                generation = self._generation
            found = self._discover()
            with self._lock:
                if self._generation == generation:
                    self._master = found
            return found

    def forget(self, address: str | None = None) -> None:
        with self._lock:
            self._generation += 1  # also drops what a discovery under way finds
            if address is None or self._master == address:
                self._master = None
                self._routes.clear()

    def _discover(self) -> str:
        timeout = min(self.timeout_ms, DISCOVERY_TIMEOUT_MS)
        futures = {
            s: self.transport.call(s, RequestCode.STATUS, None, (), timeout) for s in self.servers
        }
        best: tuple[int, str] | None = None
        for address, fut in futures.items():
            try:
                status = fut.result(timeout / 1000.0 + 5.0).fields
            except (BrokerError, concurrent.futures.TimeoutError):
                continue
            if status.get("role") in ("SYNC_MASTER", "ASYNC_MASTER"):
                candidate = (int(status.get("epoch", 0)), address)
                best = candidate if best is None or candidate > best else best
        if best is None:
            raise NoMasterError(self.servers)
        return best[1]

    def queue_nums(self, topic: str, fresh: bool = False) -> int:
        """The topic's queue count, asked of the master again once ``route_ttl_s`` old (a topic
        that gains queues is used in full), or now with ``fresh``. A failed re-ask keeps the
        count known before (the master is being found again, or is busy), unless ``fresh``."""
        now = time.monotonic()
        with self._lock:
            known = self._routes.get(topic)
        if known is not None and not fresh and now - known[1] < self.route_ttl_s:
            return known[0]
        try:
            resp = self.request(self.master(), RequestCode.TOPIC_ROUTE, {"topic": topic})
            if resp.code not in (ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST):
                raise BrokerError(resp.code, resp.remark)
        except BrokerError:
            if known is None or fresh:
                raise
            return known[0]
        nums = int(resp.fields.get("queueNums", 0))
        if nums <= 0:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, resp.remark or f"no topic {topic}")
        with self._lock:
            self._routes[topic] = (nums, now)
        return nums


class _Base:
    """Shared lifecycle: one Transport and one cluster view per client object."""

    def __init__(
        self,
        servers: str | Iterable[str],
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        route_ttl_ms: int = ROUTE_TTL_MS,
        **transport_args: Any,
    ):
        self.servers = parse_servers(servers)
        self.timeout_ms = timeout_ms
        self.retries = retries
        self._transport = Transport(name=type(self).__name__, **transport_args)
        self._cluster = _Cluster(self._transport, self.servers, timeout_ms, route_ttl_ms)
        self._closed = threading.Event()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._transport.close()

    def queue_nums(self, topic: str, fresh: bool = False) -> int:
        """How many queues ``topic`` has: cached for ``route_ttl_ms`` (30 s: RocketMQ clients
        re-read routes every 30 s, Kafka's metadata every 5 min), asked now with ``fresh``."""
        return self._cluster.queue_nums(topic, fresh)

    def _with_retries(self, attempt: Callable[[str], Any], fixed: str | None = None) -> Any:
        """Run ``attempt(master_address)``; retry retriable errors, re-discovering the master.

        With ``fixed`` (a consumer reading from a chosen broker) no master is needed at all.
        """
        give_up = time.monotonic() + self.timeout_ms / 1000.0  # for finding a master
        n = 0
        while True:
            address = None
            try:
                address = fixed or self._cluster.master()
                return attempt(address)
            except NoMasterError:
                # each discovery waits up to DISCOVERY_TIMEOUT_MS for an answer: no spin here
                if self._closed.wait(NO_MASTER_PAUSE_S) or time.monotonic() >= give_up:
                    raise
            except BrokerError as e:
                if isinstance(e, ClientTimeoutError) or e.code in REDISCOVER_CODES:
                    self._cluster.forget(address)
                if not e.retriable or n == self.retries or self._closed.is_set():
                    raise
                self._closed.wait(min(MAX_BACKOFF_S, 0.05 * 2**n))
                n += 1


# ---- Producer -------------------------------------------------------------------------------


def _message_meta(msg: Message) -> list[Any] | None:
    props = {k: v for k, v in msg.properties.items()}
    if msg.delay_level > 0:
        props["DELAY"] = str(msg.delay_level)
    keys = msg.keys if isinstance(msg.keys, str) or msg.keys is None else " ".join(msg.keys)
    if msg.tags is None and keys is None and not props and not msg.flag:
        return None
    return [msg.tags, keys, props or None, msg.flag]


class _Retries:
    """send_async messages waiting out their backoff before they are sent again: one thread
    and a heap of due times. Every message that is due goes in the same pass, so the hundreds
    of messages of the batches in flight when a connection drops are retried together after
    one backoff (one discovery finds the master for all of them), not one backoff after the
    other. ``close`` fails what is still waiting."""

    def __init__(
        self,
        retry: Callable[[_Item, BrokerError], None],
        fail: Callable[[_Item, BrokerError], None],
    ):
        self._retry = retry
        self._fail = fail
        self._heap: list[tuple[float, int, _Item, BrokerError]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="replog-producer-retry", daemon=True)
        self._thread.start()

    def add(self, due: float, item: _Item, err: BrokerError) -> bool:
        """Retry ``item`` at ``due`` (monotonic); False once closed (then the caller fails it)."""
        with self._cond:
            if self._closed:
                return False
            heapq.heappush(self._heap, (due, next(self._seq), item, err))
            self._cond.notify()
            return True

    def close(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)
        with self._cond:
            left, self._heap = self._heap, []
        for _, _, item, err in left:
            self._fail(item, err)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._closed:
                    return
                due = []
                while self._heap and self._heap[0][0] <= now:
                    _, _, item, err = heapq.heappop(self._heap)
                    due.append((item, err))
            for item, err in due:
                self._retry(item, err)


class Producer(_Base):
    """Sends messages to the master of a broker group (CONTRACT section 4)."""

    def __init__(
        self,
        servers: str | Iterable[str],
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        batch_size: int = 64,
        linger_ms: float = 0.0,
        max_batches_in_flight: int = 2,
        max_pending: int = 65_536,
        max_message_size: int = 4 * 1024 * 1024,
        spin_us: int = DEFAULT_SPIN_US,
        route_ttl_ms: int = ROUTE_TTL_MS,
    ):
        super().__init__(
            servers,
            timeout_ms,
            retries,
            route_ttl_ms,
            spin_us=spin_us,
            batch_size=batch_size,
            linger_ms=linger_ms,
            max_batches_in_flight=max_batches_in_flight,
            max_in_flight=max_pending,
            batch_timeout_ms=timeout_ms,
        )
        self.max_message_size = max_message_size
        self._rr = itertools.count()
        self._batch_size = max(1, batch_size)
        self._sticky: dict[str, tuple[int, int]] = {}  # topic -> (queue, sends left on it)
        self._sticky_lock = threading.Lock()
        self._retries = _Retries(self._retry_item, self._fail_item)

    def close(self) -> None:
        super().close()
        self._retries.close()

    def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | list[str] | None = None,
        properties: dict[str, str] | None = None,
        queue_id: int | None = None,
        delay_level: int = 0,
        flag: int = 0,
        shard_key: str | None = None,
    ) -> SendResult:
        """One message; ``shard_key`` picks its queue (every message of a key to one queue, in
        order: RocketMQ's SelectMessageQueueByHash, Kafka's keyed partitioning), ``queue_id``
        names one, neither spreads them round robin."""
        properties = _with_shard_key(properties, shard_key, queue_id)
        msg = Message(topic, body, tags, keys, dict(properties or {}), flag, delay_level)
        self._check(msg)
        fields: dict[str, Any] = {"topic": topic}
        meta = _message_meta(msg)
        if meta is not None:
            fields.update(zip(("tags", "keys", "properties", "flag"), meta, strict=True))
            fields = {k: v for k, v in fields.items() if v is not None}
        if msg.delay_level:  # also in the DELAY property, RocketMQ's carrier, as brokers read it
            fields["delayLevel"] = msg.delay_level

        def attempt(address: str) -> SendResult:
            qid = self._queue(topic, queue_id, shard_key)
            resp = self._cluster.request(
                address, RequestCode.SEND, {**fields, "queueId": qid}, [body]
            )
            return send_results(topic, resp)[0]

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def send_batch(
        self, topic: str, bodies: Sequence[bytes | Message], queue_id: int | None = None
    ) -> list[SendResult]:
        """All messages in one request: one append, dense queue offsets, one acknowledgement."""
        if not bodies:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "empty batch", False)
        fields: dict[str, Any] = {"topic": topic}
        if all(type(b) is bytes for b in bodies):  # plain bodies: no Message, no meta each
            plain = list(cast("Sequence[bytes]", bodies))
            self._check_body(topic, b"")
            longest = max(map(len, plain))
            if longest > self.max_message_size:
                self._check_body(topic, next(b for b in plain if len(b) == longest))
            packed = pack_bodies(fields, plain)
        else:
            packed = self._pack_messages(topic, bodies, fields)

        def attempt(address: str) -> list[SendResult]:
            qid = self._queue(topic, queue_id)
            resp = self._cluster.request(
                address, RequestCode.SEND_BATCH, {**fields, "queueId": qid}, packed
            )
            return send_results(topic, resp)

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def _pack_messages(
        self, topic: str, bodies: Sequence[bytes | Message], fields: dict[str, Any]
    ) -> list[bytes]:
        msgs = [b if isinstance(b, Message) else Message(topic, b) for b in bodies]
        for m in msgs:
            self._check(m)
            if m.topic != topic:
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a batch holds one topic", False)
            if m.delay_level > 0 or PROPERTY_DELAY in m.properties:
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                                  "a batch cannot hold delayed messages (send them one by one)",
                                  False)
        metas = [_message_meta(m) for m in msgs]
        if any(m is not None for m in metas):
            fields["meta"] = metas
        return pack_bodies(fields, [m.body for m in msgs])

    def send_async(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | list[str] | None = None,
        properties: dict[str, str] | None = None,
        queue_id: int | None = None,
        shard_key: str | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue a send; concurrent sends to one queue are coalesced into batch requests.
        ``shard_key`` and ``queue_id`` pick the queue as for ``send``."""
        if shard_key is not None:
            properties = _with_shard_key(properties, shard_key, queue_id)
            try:
                queue_id = self._queue(topic, None, shard_key)
            except BrokerError as e:  # no master or no such topic: reported like a send's
                failed: concurrent.futures.Future[SendResult] = LightFuture()
                failed.set_exception(e)
                return failed
        if tags is None and keys is None and not properties:
            meta = None
            self._check_body(topic, body)
        else:
            msg = Message(topic, body, tags, keys, dict(properties or {}))
            self._check(msg)
            if PROPERTY_DELAY in msg.properties:  # it would travel in a batch, which cannot
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                                  "send_async cannot delay a message: use send(delay_level=...)",
                                  False)
            meta = _message_meta(msg)
        future: concurrent.futures.Future[SendResult] = LightFuture()
        item = _Item("", topic, 0, bytes(body), meta, future, 0.0, queue_id, 0, self._on_item_error,
                     time.monotonic() + self.timeout_ms / 1000.0)
        try:
            self._transport.reserve(self.timeout_ms)
        except BrokerError as e:
            future.set_exception(e)
            return future
        try:
            self._route(item)
        except BrokerError as e:  # no master found: retried like a failed batch, if retriable
            self._on_item_error(item, e)
            return future
        self._transport.requeue(item)
        return future

    # -- internals ------------------------------------------------------------------------------
    def _check(self, msg: Message) -> None:
        self._check_body(msg.topic, msg.body)

    def _check_body(self, topic: str, body: bytes) -> None:
        """Client-side refusals, raised before anything is sent."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "body must be bytes", False)
        if len(body) > self.max_message_size:
            raise BrokerError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"body is {len(body)} bytes, maxMessageSize is {self.max_message_size}",
                False,
            )
        if not topic:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "empty topic", False)

    def _queue(self, topic: str, queue_id: int | None, shard_key: str | None = None) -> int:
        if queue_id is not None:
            return queue_id
        if shard_key is not None:
            return shard_queue(shard_key, self._cluster.queue_nums(topic))
        return next(self._rr) % self._cluster.queue_nums(topic)

    def _sticky_queue(self, topic: str) -> int:
        """Kafka's sticky partitioner: keyless async sends stay on one queue for a batch's
        worth of messages, so that concurrent sends coalesce into full batches, then move on
        round-robin (load still spreads over every queue)."""
        with self._sticky_lock:
            queue_id, left = self._sticky.get(topic, (-1, 0))
            if left <= 0:
                queue_id = next(self._rr) % self._cluster.queue_nums(topic)
                left = self._batch_size
            self._sticky[topic] = (queue_id, left - 1)
            return queue_id

    def _route(self, item: _Item) -> None:
        """Pick the master and the queue for a message (may discover: not on the I/O thread)."""
        item.address = self._cluster.master()
        if item.fixed_queue is not None:
            item.queue_id = item.fixed_queue
        else:
            item.queue_id = self._sticky_queue(item.topic)
        item.enqueued = time.monotonic()

    def _on_item_error(self, item: _Item, err: BrokerError) -> None:
        """A batch holding ``item`` failed (I/O thread) or no master was found for it (the
        sending thread): retry it on the retry thread, or fail it. Never blocks."""
        now = time.monotonic()
        if isinstance(err, NoMasterError):  # waiting for a master uses no retry (give_up)
            if now + NO_MASTER_PAUSE_S >= item.give_up or self._closed.is_set():
                self._fail_item(item, err)
            elif not self._retries.add(now + NO_MASTER_PAUSE_S, item, err):
                self._fail_item(item, err)  # the producer is closing
            return
        if isinstance(err, ClientTimeoutError) or err.code in REDISCOVER_CODES:
            self._cluster.forget(item.address)
        if not err.retriable or item.attempt >= self.retries or self._closed.is_set():
            self._fail_item(item, err)
            return
        item.attempt += 1
        backoff = min(MAX_BACKOFF_S, 0.05 * 2 ** (item.attempt - 1))
        if not self._retries.add(now + backoff, item, err):
            self._fail_item(item, err)  # the producer is closing

    def _retry_item(self, item: _Item, err: BrokerError) -> None:
        """Retry thread: the item's backoff is over; find the master again and send it."""
        try:
            self._route(item)
            self._transport.requeue(item)
        except BrokerError as e:
            self._on_item_error(item, e)

    def _fail_item(self, item: _Item, err: BrokerError) -> None:
        item.future.set_exception(err)
        self._transport.release_one()


# ---- Consumer -------------------------------------------------------------------------------


class Consumer(_Base):
    """Pulls from a broker group's consume queues; commits and fetches consumer offsets."""

    def __init__(
        self,
        servers: str | Iterable[str],
        group: str = "DEFAULT_CONSUMER",
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        read_from: str | None = None,
        spin_us: int = DEFAULT_SPIN_US,
    ):
        super().__init__(servers, timeout_ms, retries, spin_us=spin_us)
        self.group = group
        self.read_from = read_from  # a fixed broker to read from (e.g. a slave); None = master

    def pull(
        self,
        topic: str,
        queue_id: int = 0,
        offset: int = 0,
        max_nums: int = 32,
        suspend_ms: int = 0,
        tags: str | None = None,
    ) -> PullResult:
        """Read from a consume queue; ``suspend_ms`` > 0 long-polls at the end of the queue."""
        fields: dict[str, Any] = {
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxNums": max_nums,
            "group": self.group,
            "suspendMs": suspend_ms,
        }
        if tags:
            fields["tags"] = tags

        def attempt(address: str) -> PullResult:
            resp = self._cluster.request(
                self.read_from or address,
                RequestCode.PULL,
                fields,
                timeout_ms=self.timeout_ms + suspend_ms,
            )
            return pull_result(resp)

        return self._with_retries(attempt, fixed=self.read_from)  # type: ignore[no-any-return]

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest queue offset still held (RocketMQ ``minOffset``, Kafka
        ``beginning_offsets``); 0 for a queue that does not exist."""
        return self._queue_offset(RequestCode.GET_MIN_OFFSET, topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Where the queue's next message will go (RocketMQ ``maxOffset``, Kafka
        ``end_offsets``); 0 for a queue that does not exist."""
        return self._queue_offset(RequestCode.GET_MAX_OFFSET, topic, queue_id)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (ms
        since the epoch; RocketMQ ``searchOffset``, Kafka ``offsets_for_times``): the max offset
        when every message is older, so pulling from it waits for new ones."""
        return self._queue_offset(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, queue_id, timestamp=timestamp_ms
        )

    def queue_nums(self, topic: str, fresh: bool = True) -> int:
        """How many queues the topic has, asked of the master each time (``fresh`` or not);
        BrokerError
        TOPIC_NOT_EXIST when it has no such topic. (A producer's view, ``_Base.queue_nums``,
        is cached and counts the queues a first send would auto-create: a consumer's view
        counts only queues that exist.)"""

        def attempt(address: str) -> int:
            resp = self._cluster.request(address, RequestCode.TOPIC_ROUTE, {"topic": topic})
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields["queueNums"])

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def _queue_offset(self, code: RequestCode, topic: str, queue_id: int, **extra: int) -> int:
        fields: dict[str, Any] = {"topic": topic, "queueId": queue_id, **extra}

        def attempt(address: str) -> int:
            resp = self._cluster.request(self.read_from or address, code, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields["offset"])

        return self._with_retries(attempt, fixed=self.read_from)  # type: ignore[no-any-return]

    def heartbeat(self, client_id: str, session_timeout_ms: int = 10_000, leave: bool = False
                  ) -> list[str]:
        """Tell the group's master that ``client_id`` of this group is alive for the next
        ``session_timeout_ms`` (or, with ``leave``, gone); returns the group's live members,
        sorted (``GroupConsumer``)."""
        fields = {"group": self.group, "clientId": client_id,
                  "sessionTimeoutMs": session_timeout_ms, "leave": int(leave)}

        def attempt(address: str) -> list[str]:
            resp = self._cluster.request(address, RequestCode.CONSUMER_HEARTBEAT, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return [str(m) for m in resp.fields.get("members", [])]

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def commit_offset(self, topic: str, queue_id: int, offset: int,
                      client_id: str | None = None) -> None:
        """Commit the group's next offset for the queue; with ``client_id`` (a group member)
        the master refuses it (CONSUMER_NOT_ONLINE) unless the member owns the queue."""
        fields: dict[str, Any] = {"group": self.group, "topic": topic, "queueId": queue_id,
                                  "queueOffset": offset}
        if client_id:
            fields["clientId"] = client_id

        def attempt(address: str) -> None:
            resp = self._cluster.request(address, RequestCode.COMMIT_OFFSET, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)

        self._with_retries(attempt)

    def send_back(self, msg: MessageExt, delay_level: int = 0,
                  max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES) -> SendResult:
        """RocketMQ's ``sendMessageBack``: this group failed ``msg``, so the master stores a copy
        in the group's retry topic ``%RETRY%<group>``, due after ``delay_level`` (0: the
        broker's choice, level 3 + the times it came back already), or in its dead-letter topic
        ``%DLQ%<group>`` once it came back ``max_reconsume_times`` times (or at once with
        ``delay_level`` -1). The result names the copy (``topic`` is the retry or DLQ topic).

        Only a ``SEND_OK`` result means the copy is as safe as a sent message (a SYNC_MASTER's
        slave holds it): commit past ``msg`` after that, not before. A retried request may store
        two copies (at least once)."""
        if not -1 <= delay_level <= 64:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                              f"delay_level {delay_level} is not -1..64", False)
        fields: dict[str, Any] = {
            "group": self.group, "offset": msg.commit_log_offset, "originTopic": msg.topic,
            "delayLevel": delay_level, "maxReconsumeTimes": max_reconsume_times,
        }
        origin = msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id
        if origin:
            fields["originMsgId"] = origin

        def attempt(address: str) -> SendResult:
            resp = self._cluster.request(address, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
            topic = resp.fields.get("topic")
            return send_results(topic if isinstance(topic, str) else "", resp)[0]

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def fetch_offset(self, topic: str, queue_id: int) -> int:
        """The group's committed offset for the queue, or -1 when none was committed."""
        fields = {"group": self.group, "topic": topic, "queueId": queue_id}

        def attempt(address: str) -> int:
            resp = self._cluster.request(
                self.read_from or address, RequestCode.FETCH_OFFSET, fields
            )
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields.get("queueOffset", -1))

        return self._with_retries(attempt, fixed=self.read_from)  # type: ignore[no-any-return]


# ---- Admin ----------------------------------------------------------------------------------


class Admin(_Base):
    """Status, promotion, topics and message look-ups against one broker or the group."""

    def status(self, address: str | None = None) -> dict[str, Any]:
        """One broker's status snapshot (CONTRACT section 3 fields and more)."""
        return self._cluster.status(address or self.servers[0])

    def promote(self, address: str | None = None, role: str = "SYNC_MASTER") -> dict[str, Any]:
        """Turn the slave at ``address`` into its group's master; returns its new status."""
        resp = self._cluster.request(
            address or self.servers[0], RequestCode.PROMOTE, {"role": role}
        )
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        self._cluster.forget()
        return dict(resp.fields)

    def config_document(self, code: RequestCode, address: str | None = None) -> bytes:
        """A broker's table as its file holds it (JSON bytes): ``RequestCode.
        GET_ALL_TOPIC_CONFIG`` (topics.json), ``GET_ALL_CONSUMER_OFFSET`` (consumerOffset.json)
        or ``GET_ALL_DELAY_OFFSET`` (delayOffset.json); what a slave copies from its master."""
        resp = self._cluster.request(address or self.servers[0], code, {})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        if len(resp.bodies) != 1:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"{code.name}: {len(resp.bodies)} body frames, expected 1")
        return bytes(resp.bodies[0])

    def create_topic(self, topic: str, queue_nums: int) -> None:
        def attempt(address: str) -> None:
            resp = self._cluster.request(
                address, RequestCode.CREATE_TOPIC, {"topic": topic, "queueNums": queue_nums}
            )
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)

        self._with_retries(attempt)

    def query_by_key(
        self, topic: str, key: str, max_nums: int = 32, address: str | None = None
    ) -> list[MessageExt]:
        return self._query(
            RequestCode.QUERY_BY_KEY, {"topic": topic, "key": key, "maxNums": max_nums}, address
        )

    def query_by_msg_id(self, msg_id: str, address: str | None = None) -> MessageExt | None:
        found = self._query(RequestCode.QUERY_BY_MSG_ID, {"msgId": msg_id}, address)
        return found[0] if found else None

    def query_by_offset(self, phy_offset: int, address: str | None = None) -> MessageExt | None:
        found = self._query(RequestCode.QUERY_BY_OFFSET, {"phyOffset": phy_offset}, address)
        return found[0] if found else None

    def _query(
        self, code: RequestCode, fields: dict[str, Any], address: str | None
    ) -> list[MessageExt]:
        resp = self._cluster.request(address or self.servers[0], code, fields)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        try:
            return [decode_record(raw) for raw in resp.bodies]
        except ProtocolError as e:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"corrupt record in answer: {e}") from None
