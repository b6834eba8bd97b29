"""The slave's HA client: a connection to ``haMasterAddress`` driving ``SlaveCore``: a plain
TCP socket speaking ZMTP (``common/format/zmtp_link.py``), or with CURVE keys (``aclEnable``) a ZeroMQ
DEALER, whose CURVE is libzmq's.

One thread, "replog-ha-client", owns the connection (the DEALER's monitor too) and the core::

    link / DEALER (recv)  decode -> core.on_frame / on_bad_frame
    reconnected           the link's handshake, or the monitor's HANDSHAKE_SUCCEEDED, after
                          the first -> core.resync: a new HELLO at once, so the master, which
                          sees a new peer, serves us again without waiting for a heartbeat
    lost                  the link's connection ended, or the monitor's DISCONNECTED
                          -> core.resync (not transferring until the next handshake)
    poll timeout          core.next_deadline_ms -> core.tick (ack heartbeats, master silence
                          for haHousekeepingInterval -> Reconnect, retries after an ERROR)

Actions, in order: ``SendToMaster``; ``Append`` -> ``store.append_replicated`` (exact offset;
the store refuses a gap or overlap); ``Truncate`` -> ``store.truncate_to``; ``ResetLog`` ->
``store.reset_to``; ``SaveEpochs`` -> ``term.record_learned_epoch`` then ``epochs.save``;
``Reconnect`` -> close (linger 0) and open a new connection, hence a new identity at the
master;
``Failed`` -> logged (the core retries after its back-off).

If the store refuses an action (StoreError, OSError), the rest of that batch is dropped (it
holds the ack of bytes we do not have) and the core is rebuilt from the store's own max offset
and epoch file with the next session: the store is the truth, and the new HELLO resumes from it.

Fence: ``start`` takes a replication generation from the store (``store.open_replication``)
and every write to the store carries it: appends, truncations, resets, and the epoch file,
saved under ``store.replication_guard``. A promotion closes the fence under the put lock before
it writes its epoch, so a client whose ``stop`` timed out (a thread stalled on the disk) cannot
write after the new term began: its write is refused (ReplicationFencedError) and the thread
ends.

Acks: the core acks after every append; within one burst of received frames the driver sends
only the newest ack (acks are cumulative), and at least every ``haWindowBytes / 4`` appended
bytes so the master's window never stalls on us. "Acked" means in this slave's page cache; its
disk flush follows its own ``flushDiskType``. Only after the ack is sent does this thread
dispatch what it appended (``store.dispatch_inline``: ConsumeQueue and index entries, which is
reput's work): its appends do not wake the reput thread, which would otherwise compete for the
GIL between the append and the ack (a SYNC put on the master waits for that ack).

Sessions: the first is the wall clock in ms, so a restarted slave (SIGKILL) always says a
session greater than any it used before; it resumes from its own max offset (never zero unless
empty).

A thread that raises is not left dead (replication would stop and nobody be told): the error
is logged at ERROR (``event=ha_client_failed``) and counted in ``health()`` (``status.health.
haClient`` and the metrics), the socket is closed, and after a back-off
(``common.broker.loop.ParticipantHealth``) the client starts again from what its store holds,
with the next session and a new connection, as RocketMQ's HAClient reconnects.

Security (``docs/security.md``): with ``curve`` (the broker's own key pair, pinning
``haMasterPublicKeyFile``) the DEALER is a CURVE client. A handshake the master refuses (its ACL
holds no replica account with this key) or that fails (the master's key is not the pinned one)
is logged once per failing spell (``ha_handshake_failed``) and counted; nothing is replicated
meanwhile, and libzmq or the core's silence timer tries again.

``build_slave_replication`` is what ``common/cli/bootstrap.py`` calls for a slave role.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from common.broker.loop import ParticipantHealth
from common.core.config import BrokerConfig
from common.core.errors import ReplicationFencedError, StoreError
from common.core.keys import ClientKeys
from common.core.logs import log_event
from common.format.zmq_frames import readable, recv_buffers, send_frames
from common.format.zmtp_link import ZmtpLink
from common.ha import epochs as ep
from common.ha import slave_core as sc
from common.ha import term
from common.ha.protocol import Ack, HAProtocolError, Limits, decode, encode_header
from common.store.api import ReplicationStore

log = logging.getLogger("replog.ha_client")

RECV_BURST = 256
MAX_POLL_MS = 1000
JOIN_TIMEOUT_S = 5.0
SNDHWM = 1000
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 1000
MAX_MASTER_FRAMES = 2  # a DATA's header and bytes; every other message one frame
# An ACK header is msgpack [4, session, ack_offset, epoch]: a fixarray of 4, first item 4.
_ACK_PREFIX = encode_header(Ack(0, 0))[:2]
assert _ACK_PREFIX == b"\x94\x04"
_MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_HANDSHAKE_FAILURES: dict[int, str] = {
    int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): "the master refused this broker's key (no replica "
                                          "account holds it in the master's ACL)",
    int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): "protocol error (does the master run CURVE?)",
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): "the master cut the handshake (is "
                                               "haMasterPublicKeyFile the master's public key?)",
}
_CURVE_MONITOR_EVENTS = int(_MONITOR_EVENTS)
for _event in _HANDSHAKE_FAILURES:
    _CURVE_MONITOR_EVENTS |= int(_event)


@dataclasses.dataclass
class HaClientStats:
    bytes_appended: int = 0
    frames_appended: int = 0
    acks_sent: int = 0
    reconnects: int = 0
    rebuilds: int = 0
    bad_frames: int = 0
    dropped_sends: int = 0
    handshake_failures: int = 0
    last_failure: str = ""


class _ActionFailed(Exception):
    pass


class HaClient:
    """Replication client of one slave term."""

    def __init__(self, cfg: BrokerConfig, store: ReplicationStore, clock: Callable[[], float] = time.monotonic,
                 curve: ClientKeys | None = None):
        self._cfg = cfg
        self._curve = curve
        self._handshake_failing = False
        self._store = store
        self._clock = clock
        self._limits = Limits.from_config(cfg)
        self._endpoint = f"tcp://{cfg.haMasterAddress}"
        self._core: sc.SlaveCore | None = None
        self._lock = threading.Lock()  # guards _core for stats() from other threads
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None  # with CURVE keys
        self._monitor: zmq.Socket[Any] | None = None
        self._link: ZmtpLink | None = None  # without
        self._handshakes = 0
        self._thread: threading.Thread | None = None
        self._stop_r = self._stop_w = -1
        self._stopping = False
        self._pending_ack: tuple[bytes | memoryview, ...] | None = None
        self._unacked_bytes = 0
        self._undispatched = False  # appended since the last dispatch_inline
        self._confirm_applied: int | None = None  # the master's confirmed offset, as applied
        self._min_master_epoch = 0  # the controller's: an older master is refused
        self._generation: int | None = None  # the store's replication fence generation
        self._health = ParticipantHealth()
        self._health_lock = threading.Lock()
        self.stats = HaClientStats()

    def require_epoch(self, epoch: int) -> None:
        """Refuse masters older than ``epoch`` (the controller names a master of that epoch);
        every ack also carries it, so a replaced master that still hears from us stops."""
        with self._lock:
            self._min_master_epoch = max(self._min_master_epoch, epoch)
            if self._core is not None:
                self._core.require_epoch(epoch)

    def replicating(self) -> bool:
        """Bytes arrive from the master now (the core is in TRANSFER)."""
        with self._lock:
            return self._core is not None and self._core.stats().state is sc.SlaveState.TRANSFER

    def master_address(self) -> str:
        """The master's client address as its HELLO_REPLY told it ("" before any reply)."""
        with self._lock:
            return self._core.stats().master_address if self._core is not None else ""

    def status(self) -> dict[str, Any]:
        """The follower's view: state, its max offset, the master's, the lag."""
        with self._lock:
            if self._core is None:
                return {"haState": "STOPPED"}
            st = self._core.stats()
        lag = (
            max(0, st.master_max_phy_offset - st.max_phy_offset)
            if st.master_max_phy_offset >= 0
            else -1
        )
        return {
            "haState": st.state.value,
            "masterAddress": st.master_address,
            "haMasterAddress": self._cfg.haMasterAddress,
            "masterEpoch": st.master_epoch,
            "masterMaxPhyOffset": st.master_max_phy_offset,
            "maxPhyOffset": st.max_phy_offset,
            "lagBytes": lag,
            "resyncs": st.resyncs,
            **dataclasses.asdict(self.stats),
        }

    def health(self) -> dict[str, Any]:
        """State (running, restarting, failed), failures, restarts and the last error."""
        with self._health_lock:
            return self._health.as_status()

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if not self._cfg.haMasterAddress:
            log_event(
                log,
                "ha_client_idle",
                logging.WARNING,
                reason="no haMasterAddress: nothing to replicate from",
            )
            return
        self._generation = self._store.open_replication()
        self._core = self._new_core(first_session=time.time_ns() // 1_000_000)
        self._ctx = zmq.Context()
        self._stop_r, self._stop_w = os.pipe()
        os.set_blocking(self._stop_r, False)
        self._thread = threading.Thread(target=self._run, name="replog-ha-client", daemon=True)
        self._thread.start()
        log_event(
            log,
            "ha_client_started",
            master=self._cfg.haMasterAddress,
            maxPhyOffset=self._core.max_phy_offset,
            session=self._core.session,
        )

    @property
    def running(self) -> bool:
        """Its replication thread is alive and not asked to stop."""
        return not self._stopping and self._thread is not None and self._thread.is_alive()

    def stop(self) -> bool:
        """Stop the thread; False when it did not end within JOIN_TIMEOUT_S (stalled: its
        late writes are for the store's fence to refuse)."""
        if self._stopping or self._thread is None:
            self._stopping = True
            return self._thread is None or not self._thread.is_alive()
        self._stopping = True
        os.write(self._stop_w, b"\0")
        self._thread.join(JOIN_TIMEOUT_S)
        stopped = not self._thread.is_alive()
        if not stopped:
            log_event(log, "ha_client_thread_stuck", logging.ERROR, timeoutS=JOIN_TIMEOUT_S)
        else:
            assert self._ctx is not None
            self._ctx.term()
        os.close(self._stop_r)
        os.close(self._stop_w)
        log_event(log, "ha_client_stopped", appended=self.stats.bytes_appended)
        return stopped

    # ---- the client thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._session():
                pass
        finally:
            self._close()
            self._store.end_inline_dispatch()

    def _session(self) -> bool:
        """Connect and replicate until stopped (True); after a failure, back off and start
        again from the store (False: the caller runs the next session)."""
        try:
            self._open()
            with self._lock:
                assert self._core is not None
                actions = self._core.start(self._now_ms())
            self._execute(actions)
            self._flush_ack()
            self._loop()
            return True
        except Exception as e:  # noqa: BLE001 - logged below: loud, and it comes back
            error: Exception = e
        while True:
            with self._health_lock:
                wait = self._health.failed(error, restarting=not self._stopping)
            log.error("event=ha_client_failed error=%r action=%s", str(error),
                      "stopping" if self._stopping else f"restart_in_{wait:.1f}s",
                      exc_info=error)
            self._close()
            self._pending_ack = None
            self._unacked_bytes = 0
            if self._stopping or self._sleep(wait):
                return True
            try:
                with self._lock:
                    assert self._core is not None
                    session = self._core.session + 1
                core = self._new_core(first_session=session)  # from what the store holds
            except Exception as e:  # noqa: BLE001 - counted, logged, tried again later
                error = e
                continue
            with self._lock:
                self._core = core
            with self._health_lock:
                self._health.restarted()
            log_event(log, "ha_client_restarted", logging.WARNING, session=session,
                      maxPhyOffset=core.max_phy_offset)
            return False

    def _sleep(self, wait_s: float) -> bool:
        """Wait ``wait_s`` or until ``stop``; True when stopping."""
        deadline = time.monotonic() + wait_s
        while not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller = zmq.Poller()
            poller.register(self._stop_r, zmq.POLLIN)
            poller.poll(max(1, int(left * 1000)))
        return True

    def _loop(self) -> None:
        if self._curve is None:
            self._loop_tcp()
            return
        poller: zmq.Poller | None = None
        polled: tuple[Any, Any] | None = None
        while not self._stopping:
            assert self._sock is not None and self._monitor is not None
            sock, monitor = self._sock, self._monitor
            if polled != (sock, monitor):  # first pass, or a reconnect made new sockets
                poller = zmq.Poller()
                poller.register(self._stop_r, zmq.POLLIN)
                poller.register(sock, zmq.POLLIN)
                poller.register(monitor, zmq.POLLIN)
                polled = (sock, monitor)
            assert poller is not None
            events = dict(poller.poll(self._poll_timeout_ms()))
            if self._stopping:
                return
            if monitor in events:
                self._on_monitor(monitor)
            if sock in events and sock is self._sock:
                self._receive(sock)
            self._tick()
            self._flush_ack()
            self._apply_confirm()
            if self._undispatched:
                self._dispatch_appended()

    def _loop_tcp(self) -> None:
        """``_loop`` over the link: its socket (a new one after a reconnect) polled beside
        the stop pipe, with the events it asks for."""
        poller = zmq.Poller()
        poller.register(self._stop_r, zmq.POLLIN)
        polled: tuple[int | None, int] = (None, 0)
        while not self._stopping:
            link = self._link
            assert link is not None
            link.tick(time.monotonic())
            fd = link.fileno()
            wanted = (fd, link.events()) if fd is not None else (None, 0)
            if wanted != polled:
                if polled[0] is not None and polled[0] != fd:
                    with contextlib.suppress(KeyError):
                        poller.unregister(polled[0])
                if fd is not None:
                    poller.register(fd, wanted[1])
                polled = wanted
            timeout = self._poll_timeout_ms()
            wait_s = link.timeout_s(time.monotonic())
            if wait_s is not None:
                timeout = min(timeout, int(wait_s * 1000) + 1)
            events = dict(poller.poll(timeout))
            if self._stopping:
                return
            if fd is not None and fd in events and link is self._link:
                messages = link.on_ready(events[fd])
                self._link_events(link)
                self._take(messages, link)
            if link.fileno() != fd and fd is not None:  # closed: its number may be reused
                with contextlib.suppress(KeyError):
                    poller.unregister(fd)
                polled = (None, 0)
            self._tick()
            self._flush_ack()
            if self._link is not None and (self._link.lost or self._link.just_connected):
                self._link_events(self._link)  # a send found the connection gone
            self._apply_confirm()
            if self._undispatched:
                self._dispatch_appended()

    def _link_events(self, link: ZmtpLink) -> None:
        """What the link's turn found beside messages: a handshake, a lost connection, a
        refused one, a message past the bounds."""
        if link.failure:
            self.stats.handshake_failures += 1
            if not self._handshake_failing:
                self._handshake_failing = True
                self.stats.last_failure = link.failure
                log_event(log, "ha_handshake_failed", logging.ERROR,
                          master=self._cfg.haMasterAddress, reason=link.failure)
            link.failure = ""
        if link.lost:
            link.lost = ""
            self._disconnected()
        if link.just_connected:
            link.just_connected = False
            self._handshake_succeeded()
        while link.oversized and link is self._link:
            what = link.oversized.pop(0)
            self._bad_frame(f"{what.reason} in one message ({what.frames} frames, "
                            f"{what.size} bytes)")

    def _take(self, messages: list[list[bytes]], link: ZmtpLink) -> None:
        for frames in messages:
            if link is not self._link:  # a frame's actions reconnected: the rest is stale
                return
            self._on_message(frames)

    def _poll_timeout_ms(self) -> int:
        with self._lock:
            assert self._core is not None
            deadline = self._core.next_deadline_ms()
        return max(0, min(MAX_POLL_MS, deadline - self._now_ms()))

    def _tick(self) -> None:
        now_ms = self._now_ms()
        with self._lock:
            assert self._core is not None
            if now_ms < self._core.next_deadline_ms():
                return
            actions = self._core.tick(now_ms)
        self._execute(actions)

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        """A burst of frames; called when the poll found ``sock`` readable (the first ``recv``
        asks no ZMQ_EVENTS; zmq.Again still ends a burst)."""
        for i in range(RECV_BURST):
            if i and not readable(sock):
                return
            try:
                frames = recv_buffers(sock)
            except zmq.Again:
                return
            self._on_message(frames)
            if sock is not self._sock:  # the batch reconnected: the old socket is closed
                return

    def _on_message(self, frames: Any) -> None:
        try:
            frame = decode(frames, self._limits)
        except HAProtocolError as e:
            self._bad_frame(str(e))
            return
        now_ms = self._now_ms()
        with self._lock:
            assert self._core is not None
            actions = self._core.on_frame(frame, now_ms)
        self._execute(actions)

    def _bad_frame(self, reason: str) -> None:
        self.stats.bad_frames += 1
        log_event(log, "ha_bad_frame", logging.WARNING, reason=reason)
        with self._lock:
            assert self._core is not None
            actions = self._core.on_bad_frame(reason, self._now_ms())
        self._execute(actions)

    def _on_monitor(self, monitor: zmq.Socket[Any]) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._disconnected()
            elif int(event["event"]) in _HANDSHAKE_FAILURES:
                self.stats.handshake_failures += 1
                if not self._handshake_failing:
                    self._handshake_failing = True
                    why = _HANDSHAKE_FAILURES[int(event["event"])]
                    self.stats.last_failure = why
                    log_event(log, "ha_handshake_failed", logging.ERROR,
                              master=self._cfg.haMasterAddress, reason=why)
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshake_succeeded()

    def _disconnected(self) -> None:
        log_event(log, "ha_master_disconnected", logging.WARNING,
                  master=self._cfg.haMasterAddress)
        # not transferring from here: the handshake starts again once the connection is made
        # again, and meanwhile a broker without a controller looks for a newly promoted
        # master at once (Broker._follow_promoted_master), not after the
        # haHousekeepingInterval of silence (20 s by default)
        with self._lock:
            assert self._core is not None
            actions = self._core.resync("the master's connection closed", self._now_ms())
        self._execute(actions)

    def _handshake_succeeded(self) -> None:
        if self._handshake_failing:
            self._handshake_failing = False
            log_event(log, "ha_handshake_recovered", master=self._cfg.haMasterAddress)
        self._handshakes += 1
        if self._handshakes > 1:  # reconnected under us: handshake again now
            with self._lock:
                assert self._core is not None
                actions = self._core.resync("transport reconnected", self._now_ms())
            self._execute(actions)

    # ---- actions -----------------------------------------------------------------------------
    def _execute(self, actions: list[sc.SlaveAction]) -> None:
        for i, action in enumerate(actions):
            try:
                self._do(action)
            except ReplicationFencedError as e:  # promoted, or a newer client: this one ends
                log_event(log, "ha_client_fenced", logging.ERROR, action=type(action).__name__,
                          reason=str(e))
                self._stopping = True
                return
            except (StoreError, OSError, ValueError) as e:
                self._rebuild(f"{type(action).__name__} failed: {e}", dropped=len(actions) - i - 1)
                return

    def _do(self, action: sc.SlaveAction) -> None:
        if isinstance(action, sc.Append):
            self._store.append_replicated(action.phy_offset, action.data, self._generation)
            self.stats.bytes_appended += len(action.data)
            self.stats.frames_appended += 1
            self._unacked_bytes += len(action.data)
            self._undispatched = True
        elif isinstance(action, sc.SendToMaster):
            if action.frames[0][:2] == _ACK_PREFIX:
                self._pending_ack = action.frames
                if self._unacked_bytes >= self._cfg.haWindowBytes // 4:
                    self._flush_ack()
            else:
                self._flush_ack()
                self._send(action.frames)
        elif isinstance(action, sc.Truncate):
            log_event(
                log,
                "ha_truncate",
                logging.WARNING,
                phyOffset=action.phy_offset,
                maxPhyOffset=self._store.max_phy_offset,
            )
            self._store.truncate_to(action.phy_offset, self._generation)
        elif isinstance(action, sc.ResetLog):
            log_event(log, "ha_reset_log", logging.WARNING, phyOffset=action.phy_offset)
            self._store.reset_to(action.phy_offset, self._generation)
        elif isinstance(action, sc.SaveEpochs):
            with self._store.replication_guard(self._generation):  # none after a promotion
                term.record_learned_epoch(self._cfg.store_root, ep.last_epoch(action.history))
                ep.save(self._cfg.store_root, action.history)
        elif isinstance(action, sc.Reconnect):
            self.stats.reconnects += 1
            self._pending_ack = None
            log_event(log, "ha_reconnect", logging.WARNING, reason=action.reason)
            self._close()
            self._open()
        elif isinstance(action, sc.Failed):
            self.stats.last_failure = f"{action.code.name}: {action.reason}"
            log_event(
                log,
                "ha_master_refused",
                logging.ERROR,
                code=action.code.name,
                phyOffset=action.phy_offset,
                reason=action.reason,
            )

    def _flush_ack(self) -> None:
        if self._pending_ack is not None:
            frames, self._pending_ack = self._pending_ack, None
            self._unacked_bytes = 0
            self.stats.acks_sent += 1
            self._send(frames)

    def _apply_confirm(self) -> None:
        """Serve consumers up to what the master says its SyncStateSet holds (controller
        mode; NO_OFFSET: a master that holds nothing back), never a record a failover to
        another member could drop. After the ack: the master waits for that, not for this."""
        confirm = self._core.master_confirm if self._core is not None else None
        if confirm is None or confirm == self._confirm_applied:
            return
        self._confirm_applied = confirm
        self._store.set_confirm_offset(None if confirm < 0 else confirm)
        self._undispatched = True

    def _dispatch_appended(self) -> None:
        """After the ack went out: index this burst's appends here (reput was not woken)."""
        self._undispatched = False
        self._store.dispatch_inline()

    def _send(self, frames: tuple[bytes | memoryview, ...]) -> None:
        if self._link is not None:
            if not self._link.send(frames):
                self.stats.dropped_sends += 1  # not connected: the core re-sends
            return
        assert self._sock is not None
        try:
            send_frames(self._sock, frames)
        except zmq.Again:
            self.stats.dropped_sends += 1  # not connected and queue full: the core re-sends

    def _rebuild(self, reason: str, dropped: int) -> None:
        """An action failed: restart the core from what the store really holds."""
        self.stats.rebuilds += 1
        self._pending_ack = None
        self._unacked_bytes = 0
        with self._lock:
            assert self._core is not None
            session = self._core.session + 1
        log_event(
            log,
            "ha_client_resync_from_store",
            logging.ERROR,
            reason=reason,
            droppedActions=dropped,
            maxPhyOffset=self._store.max_phy_offset,
        )
        core = self._new_core(first_session=session)
        with self._lock:
            self._core = core
            actions = core.start(self._now_ms())
        self._execute(actions)

    def _new_core(self, first_session: int) -> sc.SlaveCore:
        history = ep.load(self._cfg.store_root)
        core = sc.SlaveCore(
            self._cfg, int(self._store.max_phy_offset), history, first_session, self._now_ms()
        )
        core.require_epoch(self._min_master_epoch)
        return core

    # ---- sockets -----------------------------------------------------------------------------
    def _open(self) -> None:
        self._handshakes = 0
        if self._curve is None:
            # a whole message bounded: a DATA is its header and at most max_data_bytes
            self._link = ZmtpLink(self._cfg.haMasterAddress, MAX_MASTER_FRAMES,
                                 self._limits.max_data_bytes + self._limits.max_header_bytes
                                 + 1024)
            self._link.connect_if_due(time.monotonic())
            return
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        if self._curve is not None:
            self._curve.apply(sock, self._cfg.haMasterAddress)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(
            zmq.RCVHWM, 2 * (self._cfg.haWindowBytes // self._cfg.haTransferBatchSize) + 64
        )
        sock.setsockopt(
            zmq.MAXMSGSIZE, max(self._limits.max_data_bytes, self._limits.max_header_bytes) + 1024
        )
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        self._monitor = sock.get_monitor_socket(
            _CURVE_MONITOR_EVENTS if self._curve is not None else _MONITOR_EVENTS)
        sock.connect(self._endpoint)
        self._sock = sock

    def _close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._sock.close(0)
            self._sock = None
        if self._monitor is not None:
            self._monitor.close(0)
            self._monitor = None

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def build_slave_replication(cfg: BrokerConfig, store: ReplicationStore,
                            curve: ClientKeys | None = None) -> HaClient:
    """The HA client of a slave role (``curve``: the broker's keys, security on)."""
    return HaClient(cfg, store, curve=curve)

