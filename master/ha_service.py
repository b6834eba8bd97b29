"""The master's HA service: a ZeroMQ ROUTER on ``haListenPort`` driving ``MasterCore``.

One thread, "replog-ha-service", owns the socket and feeds the core (under ``_lock``, because
``slaves()`` and the SYNC waits read the core from other threads)::

    ROUTER  (recv)       decode -> core.on_frame / on_bad_frame
    wake pipe            the store's append listener wrote a byte -> core.on_log_advanced(max)
    poll timeout         core.next_deadline_ms -> core.tick (heartbeats, silent peers);
                         store.min_phy_offset grew -> core.on_log_trimmed

and carries out the actions in order: ``Send`` and ``ReadAndSend`` (bytes read with
``store.read_committed`` at send time, straight from the mmap, never decoded), ``Drop``
(logged), ``AcksAdvanced`` (-> ``GroupTransfer.report_quorum(quorum)``, once per batch of
frames: that stores the offset and wakes the request server's I/O thread, which answers every
SYNC put it covers), ``Fenced`` (logged: a slave knows a newer epoch, failover's business).

Streaming starts as soon as bytes are appended: the append listener (called on the putting
thread, outside the put lock) writes one byte into a non-blocking self-pipe unless a wake-up is
already pending, and the thread then reads ``store.max_phy_offset`` (clearing the flag first,
so no append is missed). No polling of the log. While no slave is connected the listener does
nothing (a wake-up per put would cost the request loop a thread switch for no one); the thread
reads the max before each HELLO and once more right after the first slave appears.

Bounds: at most ``haWindowBytes`` unacked per slave (the core), ``SNDHWM`` messages queued per
peer in ZeroMQ, ``ROUTER_MANDATORY`` so a full peer says EAGAIN and a gone one EHOSTUNREACH
instead of ZeroMQ dropping silently. EAGAIN parks that peer's remaining actions in a per-peer
backlog (bounded; its reads are deferred, so no log bytes are held) that is retried when the
socket is writable again; EHOSTUNREACH or an overflowing backlog disconnects the peer in the
core. Incoming messages are capped with ``MAXMSGSIZE``.

``create(cfg, store, role_name)`` is the factory ``common/cli.py`` calls for a master role;
``build_master_replication`` returns ``(service, replica waits or None)``: the ``GroupTransfer``
the master role admits SYNC puts into, on the request server's I/O thread.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from common.config import BrokerConfig
from common.ha import master_core as mc
from common.ha import term
from common.ha.protocol import HAProtocolError, Limits, decode
from common.server import log_event
from master.group_transfer import GroupTransfer

log = logging.getLogger("replog.ha_service")

RECV_BURST = 256  # slave messages handled before the log and the timers are looked at again
MAX_POLL_MS = 1000  # longest sleep: min-offset (retention) checks and stop responsiveness
BACKLOG_RETRY_MS = 5  # after a backlog flush that made no progress
JOIN_TIMEOUT_S = 5.0
RATE_SAMPLE_MS = 1000
SNDHWM_SLACK = 64  # heartbeats and errors beyond the DATA frames of a full window
_SENT, _AGAIN, _GONE = "sent", "again", "gone"


@dataclasses.dataclass
class HaServiceStats:
    bytes_sent: int = 0
    frames_sent: int = 0
    eagain: int = 0
    dropped_peers: int = 0
    bad_frames: int = 0


class HaService:
    """Replication service of one master term."""

    def __init__(
        self,
        cfg: BrokerConfig,
        store: Any,
        role_name: str = "SYNC_MASTER",
        clock: Callable[[], float] = time.monotonic,
        bind_host: str = "0.0.0.0",
    ):
        self._cfg = cfg
        self._store = store
        self._clock = clock
        self._bind = f"tcp://{bind_host}:{cfg.ha_port}"
        self._limits = Limits.from_config(cfg)
        self._lock = threading.Lock()
        self._core: mc.MasterCore | None = None
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._wake_r = self._wake_w = -1
        self._wake_pending = False
        self._wake_lock = threading.Lock()  # the write end is never used after it is closed
        self._streaming = False  # a slave is connected: appends must wake the thread
        self._stopping = False
        self._backlog: dict[bytes, collections.deque[mc.Send | mc.ReadAndSend]] = {}
        self._backlog_cap = 4 * (cfg.haWindowBytes // max(1, cfg.haTransferBatchSize)) + 64
        self._backlog_stalled = False
        self._rates: dict[bytes, tuple[int, int, float]] = {}  # peer -> (t_ms, ack, bytes/s)
        self.stats = HaServiceStats()
        self.group_transfer: GroupTransfer | None = None
        if role_name == "SYNC_MASTER":
            self.group_transfer = GroupTransfer(cfg, self.in_sync_count, clock)

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._core.epoch if self._core is not None else 0

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Record the master term's epoch, bind, and start streaming."""
        store = self._store
        history = term.begin_master_term(
            self._cfg.store_root, int(store.min_phy_offset), int(store.max_phy_offset)
        )
        with self._lock:
            self._core = mc.MasterCore(
                self._cfg,
                history,
                int(store.min_phy_offset),
                int(store.max_phy_offset),
                self._now_ms(),
            )
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        window_frames = self._cfg.haWindowBytes // max(1, self._cfg.haTransferBatchSize) + 1
        sock.setsockopt(zmq.SNDHWM, window_frames + SNDHWM_SLACK)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_header_bytes + 1024)
        try:
            sock.bind(self._bind)
        except zmq.ZMQError as e:
            sock.close(0)
            self._ctx.term()
            raise OSError(f"HA service cannot bind {self._bind}: {e}") from e
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._store.add_append_listener(self._on_append)
        self._thread = threading.Thread(target=self._run, name="replog-ha-service", daemon=True)
        self._thread.start()
        log_event(
            log,
            "ha_service_started",
            bind=self._bind,
            epoch=history[-1].epoch,
            epochStart=history[-1].start_phy_offset,
            maxPhyOffset=store.max_phy_offset,
            sync=self.group_transfer is not None,
        )

    def stop(self) -> None:
        """Stop the thread (bounded join), close the socket with linger 0, release waiters."""
        if self._stopping:
            return
        self._stopping = True
        with self._wake_lock:
            if self._wake_w >= 0:
                _poke(self._wake_w)
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log_event(log, "ha_service_thread_stuck", logging.ERROR)
        if self.group_transfer is not None:
            self.group_transfer.stop()
        with self._wake_lock:
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        if self._ctx is not None and (self._thread is None or not self._thread.is_alive()):
            self._ctx.term()
        log_event(log, "ha_service_stopped", sent=self.stats.bytes_sent)

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

    # ---- the append listener (putting threads) -----------------------------------------------
    def _on_append(self, _max_phy_offset: int) -> None:
        if not self._streaming or self._wake_pending or self._stopping:
            return  # no slave: nobody to stream to (the thread reads the max when one comes)
        self._wake_pending = True
        with self._wake_lock:
            if self._wake_w >= 0:
                _poke(self._wake_w)

    # ---- the service thread ------------------------------------------------------------------
    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            self._loop(sock)
        except Exception:  # a dead HA thread must be loud; SYNC waits then time out
            log.exception("event=ha_service_crashed")
        finally:
            sock.close(0)

    def _loop(self, sock: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(sock, zmq.POLLIN)
        while not self._stopping:
            want_out = bool(self._backlog) and not self._backlog_stalled
            poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if want_out else 0))
            events = dict(poller.poll(self._poll_timeout_ms()))
            if self._stopping:
                return
            if self._wake_r in events:
                _drain(self._wake_r)
            actions = self._log_actions()
            if events.get(sock, 0) & zmq.POLLIN:
                actions.extend(self._receive(sock))
            was_streaming = self._streaming
            actions.extend(self._timer_actions())  # updates _streaming from the core's peers
            if self._streaming and not was_streaming:
                actions.extend(self._log_actions())  # appends since the read above woke nobody
            if self._backlog:
                self._flush_backlogs(sock)
            self._execute(sock, actions)

    def _poll_timeout_ms(self) -> int:
        timeout = MAX_POLL_MS
        with self._lock:
            deadline = self._core.next_deadline_ms() if self._core is not None else None
        if deadline is not None:
            timeout = min(timeout, max(0, deadline - self._now_ms()))
        if self._backlog and self._backlog_stalled:
            timeout = min(timeout, BACKLOG_RETRY_MS)
        return timeout

    def _log_actions(self) -> list[mc.MasterAction]:
        self._wake_pending = False  # before reading the max: a later append wakes us again
        max_phy_offset = int(self._store.max_phy_offset)
        with self._lock:
            assert self._core is not None
            if max_phy_offset > self._core.max_phy_offset:
                return self._core.on_log_advanced(max_phy_offset)
        return []

    def _receive(self, sock: zmq.Socket[Any]) -> list[mc.MasterAction]:
        actions: list[mc.MasterAction] = []
        for _ in range(RECV_BURST):
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            peer, body = msg[0], msg[1:]
            now_ms = self._now_ms()
            try:
                frame = decode(body, self._limits)
            except HAProtocolError as e:
                self.stats.bad_frames += 1
                log_event(log, "ha_bad_frame", logging.WARNING, peer=peer.hex(), reason=str(e))
                with self._lock:
                    assert self._core is not None
                    actions.extend(self._core.on_bad_frame(peer, str(e)))
                continue
            with self._lock:
                assert self._core is not None
                actions.extend(self._core.on_frame(peer, frame, now_ms))
        return actions

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
        self._streaming = bool(snaps)
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
        if acks_advanced and self.group_transfer is not None:
            gt = self.group_transfer
            gt.report_quorum(self.acked_offset_quorum(gt.needed))

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
        try:
            sock.send_multipart([action.peer_id, *frames], zmq.NOBLOCK)
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


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"\0")
    except (BlockingIOError, OSError):
        pass  # the pipe is full (a wake-up is pending anyway) or closed (stopping)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass


# ---- factories (called from the composition root, common/cli.py) -----------------------------
def build_master_replication(
    cfg: BrokerConfig, store: Any, role_name: str = "SYNC_MASTER"
) -> tuple[HaService, GroupTransfer | None]:
    """The HA service of a master term and, for SYNC_MASTER, its replica waits."""
    service = HaService(cfg, store, role_name)
    return service, service.group_transfer


def create(cfg: BrokerConfig, store: Any, role_name: str = "SYNC_MASTER") -> HaService:
    """``common/cli.py``'s hook: the service, carrying ``group_transfer`` (None when ASYNC)."""
    return build_master_replication(cfg, store, role_name)[0]
