"""The master's HA service: a server port on ``haListenPort`` driving ``MasterCore``: the host
thread's own TCP sockets read by replog's ZMTP (``common/broker/tcp_port.py``: a whole message
bounded before it is kept, no libzmq thread between a slave's ack and the loop), or with
``aclEnable`` a CURVE ROUTER.

A loop participant (``common.broker.loop``): it owns the socket but no thread. With a request server
(``build_master_replication(..., host=broker.server)``, what ``common/cli/main.py`` does) the
server's I/O thread, "replog-io", polls the HA socket beside the client ROUTER and calls::

    after_burst        after each burst of client requests (puts were appended on that very
                       thread): store.max_phy_offset -> core.on_log_advanced -> DATA frames
                       go out at once; no pipe, no other thread
    on_events          the port readable: decode -> core.on_frame / on_bad_frame; writable while
                       a peer's backlog waits: flush it
    timeout_ms/on_timer core.next_deadline_ms -> core.tick (heartbeats, silent peers);
                       store.min_phy_offset grew -> core.on_log_trimmed; transfer rates;
                       backlog retries; at least every MAX_POLL_MS
    wake (any thread)  an append made on another thread (the schedule service): the host then
                       runs after_burst (one coalesced mailbox item)

Without a request server it runs on a thread of its own, "replog-ha-service"
(``common.broker.loop.ParticipantThread``), with the same calls. The core is read under ``_lock``
because ``slaves()`` and the status/metrics threads read it from elsewhere.

Actions are carried out in order: ``Send`` and ``ReadAndSend`` (bytes read with
``store.read_committed`` at send time, straight from the mmap, never decoded), ``Drop``
(logged), ``AcksAdvanced`` (-> ``GroupTransfer.report_quorum(quorum)``, once per batch of
frames: on the I/O thread that stores the offset and has the server poll the replica waits in
the same pass, answering every SYNC put the quorum covers), ``Fenced`` (logged: a slave knows
a newer epoch, failover's business).

Appends on the host's own thread need no signal (``after_burst`` follows them); the append
listener only wakes the host for appends made on other threads, and only while a slave is
connected (a connecting slave's HELLO reads the log max anyway).

Bounds: at most ``haWindowBytes`` unacked per slave (the core). On the plain port what a slow
slave has not read waits in the port (so at most its window and a few heartbeats), and a frame
that cannot go (the slave gone, or past the port's ``MAX_BUFFERED``) disconnects the peer in
the core. On the CURVE ROUTER: ``SNDHWM`` messages queued per peer in ZeroMQ,
``ROUTER_MANDATORY`` so a full peer says EAGAIN and a gone one EHOSTUNREACH instead of ZeroMQ
dropping silently; EAGAIN parks that peer's remaining actions in a per-peer backlog (bounded;
its reads are deferred, so no log bytes are held) that is retried when the socket is writable
again (on the plain port, which never says EAGAIN, by a timer); EHOSTUNREACH or an overflowing
backlog disconnects the peer in the core. Incoming messages are capped: whole, by the plain
port (2 frames, the largest header + 1 KiB; past it a bad frame), or per frame with
``MAXMSGSIZE`` (CURVE).

Controller mode (``common/broker/controller.py``): acks count per SyncStateSet member. A SYNC
put completes once *every* member but the master holds it (``MasterCore.acked_offset_all``) and
answers SLAVE_NOT_AVAILABLE at once while the set, counting the master, is smaller than
``inSyncReplicas``. Every ``SSS_CHECK_MS`` the timer asks ``SyncStateSetKeeper`` whether a
member should leave (not connected, or not caught up for ``haMaxTimeSlaveNotCatchup``) or a
slave join; the change goes to the controller as a compare-and-set and counts only once
committed, and while it is pending acks count against both sets: a leaving member is waited
for until ZooKeeper has its removal. A slave joins in two steps, so that it holds every
acknowledged put: puts start waiting for it at once (this thread answers them), and the change
is proposed once its ack reaches the log's end as of that moment (within ``slaveTimeout``, or
the join is called off). A
slave acking in a newer epoch fences this master (``Fenced``): the controller is told at once.

Lifecycle: ``start`` records the term's epoch, binds (a bind error raises here) and attaches
to the host; ``stop`` detaches, which returns once the socket is closed on the host's thread,
then releases the SYNC waiters and terminates the service's ZeroMQ context.

Failure: an exception out of any host call (a read of the log that fails, a bug) makes the host
log it at ERROR, ``close`` the service and, after a back-off, ``reopen`` it
(``common/broker/loop.py``), as RocketMQ restarts its HA connections. ``close`` drops the core:
from then on the service reports no slave (``slaves()`` empty, ``in_sync_count()`` 0), so a
SYNC put is answered SLAVE_NOT_AVAILABLE at once instead of waiting for acks a dead service
will never read. ``reopen`` binds a new socket and starts a new core of the same term; the
slaves' DEALERs reconnect to it and say HELLO again. Puts held for the old core's acks are
answered by the new one's, or FLUSH_SLAVE_TIMEOUT at their deadline (indeterminate).

Security (``common/broker/security.py``, with ``aclEnable``): the ROUTER is a CURVE server of
ZAP domain ``replog.ha`` whose Context runs its own ZAP authenticator, started before the bind
and stopped only once the socket is closed. ZAP admits ``replica`` accounts only, and every
frame is checked again against the ACL in force (its ZAP User-Id, read with ``copy=False``):
a frame of a key that is no longer a replica account is dropped, audited, and its peer is
disconnected in the core, so no more log bytes go to it; after each ACL reload the peers
already connected are checked once more (``on_timer``).

``build_master_replication`` (what ``common/cli/bootstrap.py`` calls for a master role) returns
``(service, replica waits or None)``: the ``GroupTransfer`` the master role admits SYNC puts
into, on the request server's I/O thread.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq

from common.broker.loop import LoopHost, ParticipantThread
from common.broker.security import HA_DOMAIN, HandshakeMonitor, Security, user_id
from common.broker.tcp_port import TcpPort
from common.core.config import BrokerConfig
from common.core.logs import log_event
from common.format.acl import Denial
from common.format.zmq_frames import (
    NOBLOCK,
    POLLIN,
    readable,
    recv_rest,
    send_frames,
)
from common.ha import controller_core as cc
from common.ha import master_core as mc
from common.ha import term
from common.ha.protocol import HAProtocolError, Hello, Limits, decode
from common.store.api import ReplicationStore
from master.group_transfer import GroupTransfer

log = logging.getLogger("replog.ha_service")

RECV_BURST = 256  # slave messages handled before the host looks at anything else
MAX_POLL_MS = 1000  # longest between timers: min-offset (retention) checks, transfer rates
BACKLOG_RETRY_MS = 5  # after a backlog flush that made no progress
JOIN_TIMEOUT_S = 5.0
RATE_SAMPLE_MS = 1000
SNDHWM_SLACK = 64  # heartbeats and errors beyond the DATA frames of a full window
SSS_CHECK_MS = 250  # controller mode: how often the SyncStateSet is looked at
SSS_CONNECT_GRACE_MS = 2000  # members of the last term get this long to connect to a new one
MAX_TRACKED_PEERS = 4096  # peers whose ZAP identity is remembered (security on)
MAX_SLAVE_FRAMES = 2  # a slave's messages have one frame; a DATA (which no slave sends) two
_SENT, _AGAIN, _GONE = "sent", "again", "gone"


@dataclasses.dataclass
class HaServiceStats:
    bytes_sent: int = 0
    frames_sent: int = 0
    eagain: int = 0
    dropped_peers: int = 0
    bad_frames: int = 0
    refused_frames: int = 0  # frames of a key that is not (or no longer) a replica account


class SyncStateHost(Protocol):
    """The controller as the HA service sees it (``common/broker/controller.py``)."""

    def committed_sync_state_set(self) -> tuple[frozenset[int], int] | None: ...

    def propose(self, change: cc.SetChange, based_on_epoch: int,
                done: Callable[[bool, Any], None]) -> None: ...

    def stale_master_seen(self, epoch: int) -> None: ...


class HaService:
    """Replication service of one master term; a ``common.broker.loop.LoopParticipant``."""

    name = "haService"  # in status.health and the metrics

    def __init__(
        self,
        cfg: BrokerConfig,
        store: ReplicationStore,
        role_name: str = "SYNC_MASTER",
        clock: Callable[[], float] = time.monotonic,
        bind_host: str | None = None,
        host: LoopHost | None = None,
        sync_state: SyncStateHost | None = None,
        security: Security | None = None,
    ):
        self._cfg = cfg
        self._security = security if security is not None else Security()
        self._auth: Any = None  # the ZAP authenticator of self._ctx (security on)
        self._handshakes: HandshakeMonitor | None = None  # counts handshakes (security on)
        # peer -> (its ZAP User-Id, the ACL version it was last admitted under, a frame of it)
        self._peers: dict[bytes, tuple[str, int, zmq.Frame]] = {}
        self._acl_seen = 0
        self._store = store
        self._clock = clock
        self._bind = f"tcp://{bind_host or cfg.ha_bind_host}:{cfg.ha_port}"
        self._limits = Limits.from_config(cfg)
        self._host = host
        self._lock = threading.Lock()
        self._core: mc.MasterCore | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._sock: Any = None  # the CURVE ROUTER, or the TcpPort (self._tcp)
        self._items: tuple[tuple[Any, int], ...] = ()
        self._tcp: TcpPort | None = None  # security off: the port's own sockets and ZMTP
        self._taken: list[mc.MasterAction] = []  # the actions of the plain port's current read
        self._wake: Callable[[], None] | None = None
        self._loop_ident = 0  # the host's thread: its appends need no wake
        self._streaming = False  # a slave is connected: appends elsewhere must wake the host
        self._stopping = False
        self._attached = False  # handed to the host (until stop): a failed one is restarted
        self._history: Any = None  # the term's epoch history (start), for a reopen
        self._backlog: dict[bytes, collections.deque[mc.Send | mc.ReadAndSend]] = {}
        self._backlog_cap = 4 * (cfg.haWindowBytes // max(1, cfg.haTransferBatchSize)) + 64
        self._backlog_stalled = False
        self._rates: dict[bytes, tuple[int, int, float]] = {}  # peer -> (t_ms, ack, bytes/s)
        self.stats = HaServiceStats()
        # controller mode: the SyncStateSet as committed, a change under way, its outcome
        self._sync_state = sync_state
        self._me = cfg.brokerId
        # who is caught up, the next change, a slave's two-step join (pure: controller_core)
        self._keeper = cc.SyncStateSetKeeper(
            cfg.brokerId, cfg.haMaxTimeSlaveNotCatchup,
            connect_grace_ms=min(SSS_CONNECT_GRACE_MS, cfg.haMaxTimeSlaveNotCatchup),
            started_ms=int(clock() * 1000), join_timeout_ms=cfg.slaveTimeout)
        self._committed: frozenset[int] = frozenset({cfg.brokerId})
        self._committed_epoch = -1
        self._proposing = False
        self._proposal_result: tuple[bool, Any] | None = None
        self._required: frozenset[int] = frozenset()  # members but me whose acks a put needs
        self._sss_due_ms = 0
        self.group_transfer: GroupTransfer | None = None
        if role_name == "SYNC_MASTER":
            self.group_transfer = GroupTransfer(
                cfg, self.in_sync_count, clock,
                sync_set=(lambda: len(self._required)) if sync_state is not None else None)

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._core.epoch if self._core is not None else 0

    # ---- lifecycle (any thread) --------------------------------------------------------------
    def start(self) -> None:
        """Record the master term's epoch, bind, and hand the socket to the host."""
        store = self._store
        history = self._history = term.begin_master_term(
            self._cfg.store_root, int(store.min_phy_offset), int(store.max_phy_offset)
        )
        self._ctx = zmq.Context()
        security = self._security
        try:
            self._auth = security.start_authenticator(self._ctx)  # before any bind
            self._open()
        except BaseException:
            self._end_context()
            raise
        sock = self._sock
        assert sock is not None
        if self._sync_state is not None:
            # the set the controller committed, before anything is served: a switchover keeps
            # the old members, whose acks then bound what consumers see from the first put
            committed = self._sync_state.committed_sync_state_set()
            if committed is not None:
                self._committed, self._committed_epoch = committed
            self._set_required()
        self._store.add_append_listener(self._on_append)
        if self._host is None:
            self._host = ParticipantThread("replog-ha-service")
        try:
            self._host.attach(self)
            self._attached = True
        except BaseException:  # e.g. the request server stopped meanwhile
            self._sock = None
            self._close_handshakes()
            self._close_port(sock)
            self._end_context()
            raise
        log_event(
            log,
            "ha_service_started",
            bind=self._bind,
            epoch=history[-1].epoch,
            epochStart=history[-1].start_phy_offset,
            maxPhyOffset=store.max_phy_offset,
            sync=self.group_transfer is not None,
            host=type(self._host).__name__,
        )

    def _open(self) -> None:
        """A new core of the term and a bound port (OSError if the bind fails): without
        security the port's own sockets (``tcp_port.py``), with it a CURVE ROUTER of domain
        ``replog.ha``, whose Context's ZAP authenticator runs already (``start``;
        ``security.bind`` refuses without it)."""
        assert self._ctx is not None
        security = self._security
        self._acl_seen = security.version
        if not security.enabled:  # a whole message bounded before it is kept
            try:
                port = TcpPort(self._bind, MAX_SLAVE_FRAMES, self._limits.max_header_bytes + 1024,
                               {}, keep_silent=True)
            except OSError as e:
                raise OSError(f"HA service cannot bind {self._bind}: {e}") from e
            self._start_core()
            self._tcp = self._sock = port
            self._items = ((port.fileno(), POLLIN),)  # its epoll; a slow slave's POLLOUT in it
            return
        window_frames = self._cfg.haWindowBytes // max(1, self._cfg.haTransferBatchSize) + 1
        sock = security.server_socket(self._ctx, zmq.ROUTER, HA_DOMAIN)
        self._handshakes = security.handshake_monitor(sock, HA_DOMAIN)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, window_frames + SNDHWM_SLACK)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_header_bytes + 1024)
        self._tcp = None
        sock.setsockopt(zmq.LINGER, 0)
        try:
            security.bind(sock, self._bind)
        except Exception as e:  # a bind error or a refused bind (no authenticator)
            self._close_handshakes()
            sock.close(0)
            raise OSError(f"HA service cannot bind {self._bind}: {e}") from e
        self._start_core()
        self._sock = sock
        self._items = self._poll_items(zmq.POLLIN)

    def _start_core(self) -> None:
        store = self._store
        with self._lock:
            self._core = mc.MasterCore(
                self._cfg,
                self._history,
                int(store.min_phy_offset),
                int(store.max_phy_offset),
                self._now_ms(),
            )

    @staticmethod
    def _close_port(sock: Any) -> None:
        if isinstance(sock, TcpPort):
            sock.shutdown(0)
        else:
            sock.close(0)

    def reopen(self) -> None:
        """After a failure (the host closed it): a new socket and a new core (host thread)."""
        if self._stopping or self._ctx is None:
            raise RuntimeError("the HA service is stopping")
        self._open()
        # the slaves reconnect to the new socket: the set's members get the term's grace
        # again before one counts as "not connected" (they were, a moment ago)
        self._keeper.connect_grace_until_ms = self._now_ms() + min(
            SSS_CONNECT_GRACE_MS, self._cfg.haMaxTimeSlaveNotCatchup)
        log_event(log, "ha_service_reopened", bind=self._bind, maxPhyOffset=self._store.max_phy_offset)

    def stop(self) -> None:
        """Detach from the host (returns once the socket is closed), release the waiters."""
        if self._stopping:
            return
        self._stopping = True
        closed = True
        if self._host is not None and self._attached:
            closed = self._host.detach(self, JOIN_TIMEOUT_S)
            if not closed:
                log_event(log, "ha_service_detach_stuck", logging.ERROR)
        if self.group_transfer is not None:
            self.group_transfer.stop()
        if closed:  # else the socket may still serve: its authenticator stays (never open)
            self._end_context()
        log_event(log, "ha_service_stopped", sent=self.stats.bytes_sent)

    def _poll_items(self, flags: int) -> tuple[tuple[zmq.Socket[Any], int], ...]:
        """The ROUTER with ``flags``, and its handshake monitor (security on)."""
        sock = self._sock
        assert sock is not None
        items: tuple[tuple[zmq.Socket[Any], int], ...] = ((sock, flags),)
        if self._handshakes is not None and self._handshakes.socket is not None:
            items += ((self._handshakes.socket, zmq.POLLIN),)
        return items

    def _close_handshakes(self) -> None:
        if self._handshakes is not None:
            self._handshakes.close()
            self._handshakes = None

    def _end_context(self) -> None:
        """The authenticator stops (no socket of the Context is open any more), then the
        Context ends."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # ---- what other threads ask --------------------------------------------------------------
    def slaves(self) -> list[dict[str, Any]]:
        """Every connected slave: ``{address, ackOffset, lagBytes, inSync}`` plus details."""
        with self._lock:
            if self._core is None:
                return []
            snaps = self._core.slaves()
        out = []
        for s in snaps:
            doc = s.as_status()
            if self._sync_state is not None:
                doc["inSyncStateSet"] = s.broker_id in self._committed
            doc.update(
                brokerId=s.broker_id,
                nextPhyOffset=s.next_phy_offset,
                transferBytesPerS=round(self._rates.get(s.peer_id, (0, 0, 0.0))[2]),
                refusedAcks=s.refused_acks,
            )
            out.append(doc)
        return out

    def in_sync_count(self) -> int:
        with self._lock:
            return self._core.in_sync_count() if self._core is not None else 0

    def acked_offset_quorum(self, needed: int) -> int:
        with self._lock:
            return self._core.acked_offset_quorum(needed) if self._core is not None else -1

    def slave_acks(self) -> dict[int, int]:
        """broker id -> acked offset of every connected slave (a switchover waits on it)."""
        with self._lock:
            return self._core.progress() if self._core is not None else {}

    def sync_state_set(self) -> dict[str, Any]:
        """Controller mode: the set as committed, a change pending, who a put waits for."""
        return {"committed": sorted(self._committed), "epoch": self._committed_epoch,
                "pending": sorted(pending) if (pending := self._keeper.pending()) else None,
                "waitsFor": sorted(self._required)}

    def _quorum_offset(self) -> int:
        """The offset the replica waits may count as held by enough slaves."""
        gt = self.group_transfer
        assert gt is not None
        if self._sync_state is None:
            return self.acked_offset_quorum(gt.needed)
        if len(self._required) + 1 < self._cfg.inSyncReplicas:
            return mc.NO_OFFSET
        with self._lock:
            return self._core.acked_offset_all(self._required) if self._core is not None \
                else mc.NO_OFFSET

    # ---- the append listener (putting threads) -----------------------------------------------
    def _on_append(self, _max_phy_offset: int) -> None:
        if not self._streaming or self._stopping:
            return  # no slave: nobody to stream to (a HELLO reads the max anyway)
        if threading.get_ident() == self._loop_ident:
            return  # the host's own put: its after_burst streams it
        wake = self._wake
        if wake is not None:
            wake()

    # ---- the loop participant (the host's thread) --------------------------------------------
    def bind(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._loop_ident = threading.get_ident()

    def poll_items(self) -> Sequence[tuple[zmq.Socket[Any], int]]:
        return self._items

    def after_burst(self) -> None:
        if self._proposal_result is not None:
            self._take_proposal_result()
        if not self._streaming:
            return  # no slave: nothing to stream (a HELLO reads the max before it is served)
        sock = self._sock
        assert sock is not None
        actions = self._log_actions()
        if actions:
            self._execute(sock, actions)

    def on_events(self, sock: zmq.Socket[Any], events: int) -> None:
        if self._handshakes is not None and sock is self._handshakes.socket:
            self._handshakes.drain()
            return
        actions = self._log_actions()
        if events & POLLIN:
            actions.extend(self._receive(sock))
        if self._backlog:
            self._flush_backlogs(sock)
        self._execute(sock, actions)

    def timeout_ms(self) -> int:
        timeout = MAX_POLL_MS
        if self._sync_state is not None:
            timeout = min(timeout, max(0, self._sss_due_ms - self._now_ms()))
        with self._lock:
            deadline = self._core.next_deadline_ms() if self._core is not None else None
        if deadline is not None:
            timeout = min(timeout, max(0, deadline - self._now_ms()))
        if self._backlog and (self._backlog_stalled or self._tcp is not None):
            timeout = min(timeout, BACKLOG_RETRY_MS)  # (the port's own sockets: no POLLOUT)
        return timeout

    def on_timer(self) -> None:
        sock = self._sock
        assert sock is not None
        if self._security.enabled and self._security.version != self._acl_seen:
            self._recheck_peers()
        if self._proposal_result is not None:
            self._take_proposal_result()
        if self._sync_state is not None and self._now_ms() >= self._sss_due_ms:
            self._sss_due_ms = self._now_ms() + SSS_CHECK_MS
            self._check_sync_state_set()
        if self._tcp is not None and time.monotonic() >= self._tcp.next_sweep:
            self._tcp.sweep(None, time.monotonic())
        actions = self._log_actions()
        actions.extend(self._timer_actions())
        if self._backlog:
            self._flush_backlogs(sock)
        self._execute(sock, actions)

    def close(self) -> None:
        """Host thread: close the socket and drop the core (no slave is reported any more)."""
        self._wake = None
        self._streaming = False
        self._close_handshakes()
        if self._sock is not None:
            self._close_port(self._sock)
            self._sock = None
            self._tcp = None
        with self._lock:
            self._core = None
        self._backlog.clear()
        self._backlog_stalled = False
        self._rates.clear()

    # ---- inputs ------------------------------------------------------------------------------
    def _log_actions(self) -> list[mc.MasterAction]:
        max_phy_offset = int(self._store.max_phy_offset)
        with self._lock:
            assert self._core is not None
            if max_phy_offset > self._core.max_phy_offset:
                return self._core.on_log_advanced(max_phy_offset)
        return []

    def _receive(self, sock: zmq.Socket[Any]) -> list[mc.MasterAction]:
        """A burst of frames; called when the poll found ``sock`` readable (the first ``recv``
        asks no ZMQ_EVENTS; zmq.Again still ends a burst)."""
        if self._tcp is not None:
            return self._receive_tcp(self._tcp)
        actions: list[mc.MasterAction] = []
        for i in range(RECV_BURST):
            if i and not readable(sock):
                break
            try:
                head = sock.recv(NOBLOCK, copy=False)
            except zmq.Again:
                break
            peer, body = head.bytes, recv_rest(sock, head)
            if self._admitted(peer, head):
                self._take(peer, body, actions, secure=True)
        return actions

    def _receive_tcp(self, port: TcpPort) -> list[mc.MasterAction]:
        """As ``_receive``, from the port's own connections (a read of each ready one, its
        ZMTP read by the port); a message past the bounds is a bad frame."""
        actions = self._taken = []
        port.serve(self._take_plain)
        if port.dropped:
            dropped, port.dropped = port.dropped, []
            for who, what in dropped:
                self._bad_frame(who, f"{what.reason} in one message ({what.frames} "
                                f"frames, {what.size} bytes)", actions)
        return actions

    def _take_plain(self, peer: bytes, body: list[bytes]) -> None:
        """The plain port's handler of a whole message (bound once, not made per read)."""
        self._take(peer, body, self._taken, secure=False)

    def _bad_frame(self, peer: bytes, reason: str, actions: list[mc.MasterAction]) -> None:
        self.stats.bad_frames += 1
        log_event(log, "ha_bad_frame", logging.WARNING, peer=peer.hex(), reason=reason)
        with self._lock:
            assert self._core is not None
            actions.extend(self._core.on_bad_frame(peer, reason))

    def _take(self, peer: bytes, body: list[bytes], actions: list[mc.MasterAction],
              secure: bool) -> None:
        """One slave message: decoded and handed to the core (its actions into ``actions``)."""
        now_ms = self._now_ms()
        try:
            frame = decode(body, self._limits)
        except HAProtocolError as e:
            self._bad_frame(peer, str(e), actions)
            return
        if secure and isinstance(frame, Hello) and not self._may_be_member(peer, frame):
            return
        with self._lock:
            assert self._core is not None
            actions.extend(self._core.on_frame(peer, frame, now_ms))

    def _may_be_member(self, peer: bytes, hello: Hello) -> bool:
        """Security on: the key says HELLO as member ``hello.broker_id`` only if its account
        names that member (``brokerIds``), and never while another key is connected as that
        member: no replica key can displace member N and ack for it."""
        user, _, head = self._peers[peer]
        found = self._security.account_of(user, head)
        denial = found if isinstance(found, Denial) else found.may_be_member(hello.broker_id)
        if denial is None:
            with self._lock:
                assert self._core is not None
                holder = self._core.member_peer(hello.broker_id)
            other = self._peers.get(holder) if holder not in (None, peer) else None
            if other is not None and other[0] != user:
                denial = Denial(found.access_key if not isinstance(found, Denial) else "",
                                "REPLICATE", f"Member:{hello.broker_id}",
                                f"member {hello.broker_id} is connected with another key",
                                "member_taken")
        if denial is None:
            return True
        self._refuse(peer, user, head, denial)
        return False

    # ---- security (on) -----------------------------------------------------------------------
    def _admitted(self, peer: bytes, head: zmq.Frame) -> bool:
        """Whether a frame from ``peer`` comes from a replica account of the ACL in force."""
        user = user_id(head)
        version = self._security.version
        known = self._peers.get(peer)
        if known is not None and known[0] == user and known[1] == version:
            return True
        denial = self._replica_denial(user, head)
        if denial is not None:
            self._refuse(peer, user, head, denial)
            return False
        if known is None and len(self._peers) >= MAX_TRACKED_PEERS:
            self._peers.pop(next(iter(self._peers)))
        self._peers[peer] = (user, version, head)
        return True

    def _replica_denial(self, user: str, head: zmq.Frame) -> Denial | None:
        found = self._security.account_of(user, head)
        if isinstance(found, Denial):
            return found
        return found.may_replicate()

    def _refuse(self, peer: bytes, user: str, head: zmq.Frame, denial: Denial) -> None:
        self.stats.refused_frames += 1
        self._security.refused("ha", user, head, denial)
        self._peers.pop(peer, None)
        self._disconnect(peer, f"refused by the ACL: {denial.reason}")  # no more log bytes

    def _recheck_peers(self) -> None:
        """After an ACL reload: every connected peer is checked against the new ACL."""
        self._acl_seen = self._security.version
        for peer, (user, _, head) in list(self._peers.items()):
            denial = self._replica_denial(user, head)
            if denial is not None:
                self._refuse(peer, user, head, denial)
            else:
                self._peers[peer] = (user, self._acl_seen, head)

    def _timer_actions(self) -> list[mc.MasterAction]:
        now_ms = self._now_ms()
        min_phy_offset = int(self._store.min_phy_offset)
        with self._lock:
            core = self._core
            assert core is not None
            actions: list[mc.MasterAction] = []
            if min_phy_offset > core.min_phy_offset:
                actions.extend(core.on_log_trimmed(min(min_phy_offset, core.max_phy_offset)))
            deadline = core.next_deadline_ms()
            if deadline is not None and deadline <= now_ms:
                actions.extend(core.tick(now_ms))
            snaps = core.slaves()
        self._sample_rates(snaps, now_ms)
        return actions

    def _sample_rates(self, snaps: tuple[mc.SlaveSnapshot, ...], now_ms: int) -> None:
        live = {s.peer_id for s in snaps}
        for peer in [p for p in self._rates if p not in live]:
            del self._rates[peer]
        for s in snaps:
            t0, ack0, rate = self._rates.get(s.peer_id, (now_ms, s.ack_offset, 0.0))
            if now_ms - t0 >= RATE_SAMPLE_MS:
                rate = (s.ack_offset - ack0) * 1000 / (now_ms - t0)
                t0, ack0 = now_ms, s.ack_offset
            self._rates[s.peer_id] = (t0, ack0, rate)

    # ---- carrying out actions ----------------------------------------------------------------
    def _execute(self, sock: zmq.Socket[Any], actions: list[mc.MasterAction]) -> None:
        acks_advanced = False
        for action in actions:
            if isinstance(action, mc.Send | mc.ReadAndSend):
                self._send_or_park(sock, action)
            elif isinstance(action, mc.AcksAdvanced):
                acks_advanced = True
            elif isinstance(action, mc.Drop):
                self._dropped(action)
            elif isinstance(action, mc.Fenced):
                log_event(
                    log,
                    "ha_master_fenced",
                    logging.ERROR,
                    peer=action.peer_id.hex(),
                    epoch=action.epoch,
                    reason=action.reason,
                )
                if self._sync_state is not None:
                    self._sync_state.stale_master_seen(action.epoch)
        if acks_advanced:
            if self.group_transfer is not None:
                self.group_transfer.report_quorum(self._quorum_offset())
            self._update_confirm(dispatch=True)
        self._after_actions(sock)

    def _after_actions(self, sock: zmq.Socket[Any]) -> None:
        """Peers or backlogs may have changed: what to poll for, whether appends must wake."""
        want_out = bool(self._backlog) and not self._backlog_stalled and self._tcp is None
        flags = zmq.POLLIN | zmq.POLLOUT if want_out else zmq.POLLIN
        if self._items[0][1] != flags:
            self._items = self._poll_items(flags)
        with self._lock:
            assert self._core is not None
            streaming = self._core.peer_count > 0
        if streaming and not self._streaming:
            self._streaming = True  # before reading the max: a later append elsewhere wakes
            actions = self._log_actions()
            if actions:
                self._execute(sock, actions)
        self._streaming = streaming

    def _send_or_park(self, sock: zmq.Socket[Any], action: mc.Send | mc.ReadAndSend) -> None:
        queue = self._backlog.get(action.peer_id)
        if queue is None:
            if self._try_send(sock, action) != _AGAIN:
                return
            queue = self._backlog[action.peer_id] = collections.deque()
        if len(queue) >= self._backlog_cap:
            self._disconnect(action.peer_id, f"send backlog over {self._backlog_cap} messages")
            return
        queue.append(action)

    def _try_send(self, sock: zmq.Socket[Any], action: mc.Send | mc.ReadAndSend) -> str:
        """_SENT, _AGAIN (the peer's queue is full) or _GONE (peer disconnected)."""
        if isinstance(action, mc.ReadAndSend):
            data = self._store.read_committed(action.phy_offset, action.length)
            try:
                frames = action.frames(data)
            except ValueError as e:  # the log did not hold what the core promised: a bug
                log_event(log, "ha_read_short", logging.ERROR, reason=str(e))
                self._disconnect(action.peer_id, str(e))
                return _GONE
            size = action.length
        else:
            frames = list(action.frames)
            size = 0
        tcp = self._tcp
        if tcp is not None:  # never EAGAIN: what a slow slave has not read waits in the port
            if not tcp.send(None, action.peer_id, frames):  # (at most its window: the core's)
                gone = action.peer_id not in tcp.conns
                self._disconnect(action.peer_id, "peer gone" if gone else
                                 "peer not reading (its send buffer is full)")
                return _GONE
            self.stats.frames_sent += 1
            self.stats.bytes_sent += size
            return _SENT
        try:
            send_frames(sock, frames, action.peer_id)
        except zmq.ZMQError as e:
            if e.errno == errno.EAGAIN:
                self.stats.eagain += 1
                return _AGAIN
            if e.errno == errno.EHOSTUNREACH:
                self._disconnect(action.peer_id, "peer unreachable (EHOSTUNREACH)")
                return _GONE
            raise
        self.stats.frames_sent += 1
        self.stats.bytes_sent += size
        return _SENT

    def _flush_backlogs(self, sock: zmq.Socket[Any]) -> None:
        progress = False
        for peer in list(self._backlog):
            queue = self._backlog.get(peer)
            while queue:
                outcome = self._try_send(sock, queue[0])
                if outcome == _AGAIN:
                    break
                if outcome == _GONE:
                    queue.clear()
                    break
                queue.popleft()
                progress = True
            if not queue:
                self._backlog.pop(peer, None)
        self._backlog_stalled = not progress

    def _disconnect(self, peer: bytes, reason: str) -> None:
        with self._lock:
            assert self._core is not None
            actions = self._core.disconnect(peer, reason)
        self._backlog.pop(peer, None)
        for action in actions:
            if isinstance(action, mc.Drop):
                self._dropped(action)

    def _dropped(self, action: mc.Drop) -> None:
        self.stats.dropped_peers += 1
        self._peers.pop(action.peer_id, None)
        self._backlog.pop(action.peer_id, None)
        self._rates.pop(action.peer_id, None)
        log_event(
            log,
            "ha_slave_dropped",
            logging.WARNING,
            peer=action.peer_id.hex(),
            reason=action.reason,
        )

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ---- controller mode: the SyncStateSet (the host's thread) -------------------------------
    def _check_sync_state_set(self) -> None:
        committed = self._sync_state.committed_sync_state_set() if self._sync_state else None
        if committed is None:
            return  # the controller does not (yet) name this broker master
        members, epoch = committed
        if epoch != self._committed_epoch:
            self._committed, self._committed_epoch = members, epoch
            self._set_required()
        if self._proposing:
            return
        with self._lock:
            core = self._core
            assert core is not None
            progress = core.progress()
            master_max = core.max_phy_offset
            epoch_start = core.history[-1].start_phy_offset
        slaves = [cc.SlaveProgress(m, a) for m, a in progress.items()]
        confirmed = self._store.confirm_phy_offset
        # a join's mark: the log's end now, past which consumers see nothing until the
        # candidate holds it too (bound here, under the put lock)
        step = self._keeper.check(
            members, slaves, master_max, epoch_start, self._now_ms(),
            confirmed=0 if confirmed is None else int(confirmed),
            mark_of=self._store.bound_confirm_offset)
        if step.cancelled:
            log_event(log, "ha_sync_state_set_join_cancelled", reason=step.cancelled)
        if step.joined or step.cancelled:
            # step 1 of a join: from now on a put waits for the candidate too (this thread
            # answers the puts, so none is acknowledged without it from here)
            self._set_required()
        if step.propose is not None:
            self._propose(step.propose, epoch)

    def _propose(self, change: cc.SetChange, epoch: int) -> None:
        self._proposing = True
        log_event(log, "ha_sync_state_set_change", members=sorted(change.members),
                  reason=change.reason)
        assert self._sync_state is not None
        self._sync_state.propose(change, epoch, self._on_proposal_done)

    def _on_proposal_done(self, ok: bool, state: Any) -> None:
        """The controller thread: the compare-and-set's outcome, taken on the host's thread."""
        self._proposal_result = (ok, state)
        wake = self._wake
        if wake is not None:
            wake()

    def _take_proposal_result(self) -> None:
        result, self._proposal_result = self._proposal_result, None
        if result is None:
            return
        ok, state = result
        self._proposing = False
        self._keeper.settled()
        if ok and state is not None:
            self._committed = state.sync_state_set
            self._committed_epoch = state.sync_state_set_epoch
        self._set_required()

    def _set_required(self) -> None:
        members = self._committed | (self._keeper.pending() or frozenset())
        self._required = frozenset(members - {self._me})
        if self.group_transfer is not None:
            self.group_transfer.report_quorum(self._quorum_offset())
        self._update_confirm(dispatch=self._attached)

    # ---- controller mode: the confirmed offset (RocketMQ 5's confirmOffset) --------------------
    def _update_confirm(self, dispatch: bool) -> None:
        """Controller mode: the store serves consumers only what every member of the
        SyncStateSet holds (counting a member joining or leaving until ZooKeeper has it), so
        a failover to any of them loses nothing a consumer was given; with no member but this
        master, everything. The slaves hear it in their frames (``MasterCore``)."""
        if self._sync_state is None:
            return
        store = self._store
        before = store.confirm_phy_offset
        if not self._required:
            if before is not None:
                store.set_confirm_offset(None)
        else:
            if before is None:
                self._store.bound_confirm_offset()
            with self._lock:
                acked = self._core.acked_offset_all(self._required) \
                    if self._core is not None else mc.NO_OFFSET
            if acked > (store.confirm_phy_offset or 0):
                store.set_confirm_offset(acked)
        after = store.confirm_phy_offset
        with self._lock:
            if self._core is not None:
                self._core.set_confirm_offset(mc.NO_OFFSET if after is None else after)
        if dispatch and after != before:
            store.dispatch_inline()  # the host's thread: what the acks uncovered, now


# ---- factories (called from the composition root, common/cli/main.py) -----------------------------
def build_master_replication(
    cfg: BrokerConfig, store: ReplicationStore, role_name: str = "SYNC_MASTER", host: LoopHost | None = None,
    sync_state: SyncStateHost | None = None,
    security: Security | None = None,
) -> tuple[HaService, GroupTransfer | None]:
    """The HA service of a master term and, for SYNC_MASTER, its replica waits. ``host``: the
    request server whose I/O thread drives it (None: a thread of its own); ``sync_state``: the
    controller, in controller mode; ``security``: the broker's (``common/broker/security.py``;
    None: plain)."""
    service = HaService(cfg, store, role_name, host=host, sync_state=sync_state,
                        security=security)
    return service, service.group_transfer

