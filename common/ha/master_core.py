"""The master's side of replication as a deterministic state machine (no sockets, no threads).

The driver (``master/ha_service.py``: a ZeroMQ ROUTER) decodes each slave message with
``common.ha.protocol.decode`` and feeds it in, together with log growth and the clock:

    on_frame(peer_id, frame, now_ms)     -> on_hello / on_ack / ...
    on_bad_frame(peer_id, reason)        a frame that failed to decode
    on_log_advanced(max_phy_offset)      the store appended (``store.add_append_listener``)
    on_log_trimmed(min_phy_offset)       old segments were deleted
    tick(now_ms)                         heartbeats and housekeeping; see ``next_deadline_ms``
    disconnect(peer_id, reason)          the socket says the peer is gone (ROUTER_MANDATORY)

and carries out, in order, the actions each call returns:

    Send(peer_id, frames)                send these multipart frames to the peer
    ReadAndSend(peer_id, ..., phy_offset, length)
                                         ``data = store.read_committed(phy_offset, length)``;
                                         send ``action.frames(data)`` (exactly ``length`` bytes:
                                         ranges never cross a segment or an epoch boundary)
    Drop(peer_id, reason)                the peer is forgotten (log it)
    AcksAdvanced(peer_id, ack_offset)    wake SYNC waiters: ``acked_offset_quorum(needed)``
    Fenced(peer_id, epoch, reason)       a slave knows a newer epoch: this master is stale

The core never holds log bytes. Per slave it keeps the next offset to send, the last ack, the
time it was last heard from and last sent to. At most ``haWindowBytes`` are in flight
(sent, not acked) per slave, in DATA frames of at most ``haTransferBatchSize`` bytes. With
``haFlowControlEnable`` (RocketMQ 5's flow control, off by default) each slave is also sent at
most ``maxHaTransferByteInSecond`` per second through a token bucket refilled every
millisecond and holding at most two batches, so that frames leave one or two at a time (a
far-behind slave's catch-up then cannot take the master's CPU and disk from its clients: a
bucket per 100 ms slice sent bursts that held client requests up to 5 ms at 32 MB/s, and one
per 10 ms still raised their p99 by ~1 ms, the slave taking each burst on the same 2 CPUs); the
moment a held-back peer has a batch's worth again is a ``next_deadline_ms``, and ``tick`` sends
it.

Rules (RocketMQ issues in brackets): an ack beyond what was sent drops the peer [#3015]; an ack
going backwards is refused (ignored and counted); a HELLO whose offsets the master cannot serve
gets an explicit ERROR OFFSET_OUT_OF_RANGE, never a silent heartbeat loop [#3388]; a slave whose
epoch history diverges is told where to truncate (``epochs.find_divergence``); a slave with a
newer epoch fences this master. Idle peers get a HEARTBEAT every ``haSendHeartbeatInterval``;
a peer silent for ``haHousekeepingInterval`` is dropped. A slave is *in sync* when it has
handshaken, was heard from within ``haHousekeepingInterval`` and lags by at most
``haMaxGapNotInSync`` bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeAlias

from common.core.config import BrokerConfig
from common.core.errors import ResponseCode
from common.ha import epochs as ep
from common.ha.epochs import EpochHistory
from common.ha.protocol import (
    NO_OFFSET,
    PROTOCOL_VERSION,
    Ack,
    Error,
    Frame,
    Heartbeat,
    Hello,
    HelloReply,
    encode_data,
    encode_header,
)

PeerId: TypeAlias = bytes
DEFAULT_MAX_PEERS = 16
CONFIRM_NOTICE_MS = 20  # a caught-up peer hears of a new confirmed offset at most this late
FLOW_BURST_BATCHES = 2  # haFlowControlEnable: the bucket holds this many haTransferBatchSize


# ---- actions ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    peer_id: PeerId
    frames: tuple[bytes | memoryview, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ReadAndSend:
    """Read ``length`` committed bytes at ``phy_offset`` and send them as one DATA frame."""

    peer_id: PeerId
    session: int
    epoch: int
    epoch_start_phy_offset: int
    phy_offset: int
    length: int
    confirm_offset: int = NO_OFFSET

    def frames(self, data: bytes | memoryview) -> list[bytes | memoryview]:
        if len(data) != self.length:
            raise ValueError(f"read {len(data)} bytes at {self.phy_offset}, need {self.length}")
        return encode_data(self.session, self.epoch, self.epoch_start_phy_offset,
                           self.phy_offset, data, self.confirm_offset)


@dataclasses.dataclass(frozen=True, slots=True)
class Drop:
    peer_id: PeerId
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class AcksAdvanced:
    peer_id: PeerId
    ack_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Fenced:
    peer_id: PeerId
    epoch: int
    reason: str


MasterAction: TypeAlias = Send | ReadAndSend | Drop | AcksAdvanced | Fenced


@dataclasses.dataclass(frozen=True, slots=True)
class SlaveSnapshot:
    """One slave as the master sees it (feeds ``replog status`` and metrics)."""

    peer_id: PeerId
    address: str
    broker_id: int
    session: int
    ack_offset: int
    next_phy_offset: int
    lag_bytes: int
    in_sync: bool
    last_heard_ms: int
    refused_acks: int

    def as_status(self) -> dict[str, Any]:
        """docs/contract.md's ``slaves`` entry of ``replog status --json``."""
        return {"address": self.address, "ackOffset": self.ack_offset,
                "lagBytes": self.lag_bytes, "inSync": self.in_sync}


@dataclasses.dataclass(slots=True)
class _Peer:
    peer_id: PeerId
    broker_id: int
    address: str
    session: int
    next_phy_offset: int
    ack_offset: int
    last_heard_ms: int
    last_sent_ms: int
    refused_acks: int = 0
    flow_tokens: float = -1.0  # bytes the peer may be sent now (-1: a full bucket, first use)
    flow_at_ms: int = 0  # when the bucket was last refilled
    told_confirm: int = NO_OFFSET  # the confirmed offset the peer was last sent


def _error(peer_id: PeerId, session: int, code: ResponseCode, reason: str,
           phy_offset: int = NO_OFFSET) -> Send:
    return Send(peer_id, (encode_header(Error(session, code, phy_offset, reason)),))


class MasterCore:
    """Per-slave replication state of one master term (one epoch)."""

    def __init__(self, cfg: BrokerConfig, history: EpochHistory, min_phy_offset: int,
                 max_phy_offset: int, now_ms: int, max_peers: int = DEFAULT_MAX_PEERS):
        ep.validate(history)
        if not history or history[0].start_phy_offset > min_phy_offset:
            raise ValueError(f"epoch history {history} must cover the log from {min_phy_offset}")
        if history[-1].start_phy_offset > max_phy_offset:
            raise ValueError(f"last epoch {history[-1]} starts beyond max {max_phy_offset}")
        if not 0 <= min_phy_offset <= max_phy_offset:
            raise ValueError(f"bad offsets min={min_phy_offset} max={max_phy_offset}")
        self._cfg = cfg
        self._client_address = cfg.client_address  # told to slaves in HELLO_REPLY
        self._history = history
        self._min = min_phy_offset
        self._max = max_phy_offset
        self._now_ms = now_ms
        self._max_peers = max_peers
        self._peers: dict[PeerId, _Peer] = {}
        # the confirmed offset sent to the slaves (NO_OFFSET: none, a master without the
        # controller); set by the driver, never decided here
        self._confirm = NO_OFFSET

    # ---- read-only state ---------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._history[-1].epoch

    @property
    def history(self) -> EpochHistory:
        return self._history

    @property
    def max_phy_offset(self) -> int:
        return self._max

    @property
    def min_phy_offset(self) -> int:
        return self._min

    @property
    def confirm_offset(self) -> int:
        return self._confirm

    def set_confirm_offset(self, confirm_offset: int) -> None:
        """What every SyncStateSet member holds (the driver computes it): carried in every
        DATA frame, and in a HEARTBEAT to a peer no DATA goes to (``tick``, within
        CONFIRM_NOTICE_MS), so a slave serves consumers exactly what survives a failover."""
        self._confirm = confirm_offset

    @property
    def peer_count(self) -> int:
        return len(self._peers)

    def in_sync_count(self) -> int:
        return sum(1 for p in self._peers.values() if self._in_sync(p))

    def acked_offset_quorum(self, n: int) -> int:
        """The highest offset that at least ``n`` in-sync slaves have acked (the master's max
        for ``n <= 0``); NO_OFFSET when fewer than ``n`` slaves are in sync."""
        if n <= 0:
            return self._max
        acks = sorted((p.ack_offset for p in self._peers.values() if self._in_sync(p)),
                      reverse=True)
        return acks[n - 1] if len(acks) >= n else NO_OFFSET

    def acked_offset_all(self, members: frozenset[int]) -> int:
        """The highest offset every slave of ``members`` (broker ids) has acked: what a
        SyncStateSet holds (the master's max when it names no slave); NO_OFFSET while a member
        has no connection that finished its handshake."""
        if not members:
            return self._max
        acks: dict[int, int] = {}
        for p in self._peers.values():
            if p.broker_id in members:
                acks[p.broker_id] = max(acks.get(p.broker_id, NO_OFFSET), p.ack_offset)
        if len(acks) < len(members):
            return NO_OFFSET
        return min(acks.values())

    def member_peer(self, broker_id: int) -> PeerId | None:
        """The connection serving member ``broker_id`` now (None: none)."""
        for p in self._peers.values():
            if p.broker_id == broker_id:
                return p.peer_id
        return None

    def progress(self) -> dict[int, int]:
        """broker id -> the offset it has acked, for every connected slave."""
        out: dict[int, int] = {}
        for p in self._peers.values():
            out[p.broker_id] = max(out.get(p.broker_id, NO_OFFSET), p.ack_offset)
        return out

    def slaves(self) -> tuple[SlaveSnapshot, ...]:
        return tuple(self._snapshot(p) for p in self._peers.values())

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has something to do (None: no peers): a heartbeat, a silent
        peer, or the next flow-control slice of a peer held back by it."""
        times = [min(self._beat_due_ms(p), p.last_heard_ms + self._cfg.haHousekeepingInterval + 1)
                 for p in self._peers.values()]
        for p in self._peers.values():
            short = self._flow_shortfall(p)
            if short > 0:
                rate = self._cfg.maxHaTransferByteInSecond
                times.append(p.flow_at_ms + max(1, -(-short * 1000 // rate)))
        return min(times) if times else None

    # ---- inputs ------------------------------------------------------------------------------
    def on_frame(self, peer_id: PeerId, frame: Frame, now_ms: int) -> list[MasterAction]:
        if isinstance(frame, Hello):
            return self.on_hello(peer_id, frame, now_ms)
        if isinstance(frame, Ack):
            return self.on_ack(peer_id, frame, now_ms)
        self._clock(now_ms)
        if isinstance(frame, Error):
            return self._forget(peer_id, f"slave reported {frame.code.name}: {frame.reason}")
        kind = type(frame).__name__
        return [_error(peer_id, frame.session, ResponseCode.BAD_REQUEST,
                       f"a slave may not send {kind}"),
                *self._forget(peer_id, f"sent {kind}")]

    def on_bad_frame(self, peer_id: PeerId, reason: str) -> list[MasterAction]:
        """A frame from ``peer_id`` failed to decode (HAProtocolError): refuse and drop."""
        return [_error(peer_id, 0, ResponseCode.BAD_REQUEST, f"malformed frame: {reason}"),
                *self._forget(peer_id, f"malformed frame: {reason}")]

    def on_hello(self, peer_id: PeerId, hello: Hello, now_ms: int) -> list[MasterAction]:
        self._clock(now_ms)
        refusal = self._refuse_hello(peer_id, hello)
        if refusal is not None:
            return refusal
        start = self._start_offset(hello)
        if isinstance(start, Error):
            return [Send(peer_id, (encode_header(start),)), *self._forget(peer_id, start.reason)]
        actions = self._replace_same_broker(peer_id, hello.broker_id)
        peer = _Peer(peer_id, hello.broker_id, hello.slave_address, hello.session,
                     next_phy_offset=start, ack_offset=start, last_heard_ms=self._now_ms,
                     last_sent_ms=self._now_ms)
        self._peers[peer_id] = peer
        reply = HelloReply(hello.session, self.epoch, self._min, self._max, start, self._history,
                           self._client_address)
        actions.append(Send(peer_id, (encode_header(reply),)))
        actions.extend(self._fill(peer))
        return actions

    def on_ack(self, peer_id: PeerId, ack: Ack, now_ms: int) -> list[MasterAction]:
        self._clock(now_ms)
        peer = self._peers.get(peer_id)
        if peer is None:
            return [_error(peer_id, ack.session, ResponseCode.BAD_REQUEST,
                           "no handshake on this connection: send HELLO")]
        if ack.session != peer.session:
            return []  # from an older handshake of this connection
        if ack.epoch > self.epoch:
            # the slave follows a newer master: this one is stale and must not count the ack
            reason = (f"slave {peer.address} acks in epoch {ack.epoch}, this master is at "
                      f"{self.epoch}")
            return [_error(peer_id, ack.session, ResponseCode.STALE_EPOCH, reason),
                    Fenced(peer_id, ack.epoch, reason), *self._forget(peer_id, reason)]
        if ack.ack_offset > peer.next_phy_offset:
            reason = (f"impossible ack {ack.ack_offset}: only {peer.next_phy_offset} was sent "
                      f"(master max {self._max})")
            return [_error(peer_id, ack.session, ResponseCode.BAD_REQUEST, reason),
                    *self._forget(peer_id, reason)]
        if ack.ack_offset < peer.ack_offset:
            peer.refused_acks += 1
            return []
        peer.last_heard_ms = self._now_ms
        actions: list[MasterAction] = []
        if ack.ack_offset > peer.ack_offset:
            peer.ack_offset = ack.ack_offset
            actions.append(AcksAdvanced(peer_id, ack.ack_offset))
        actions.extend(self._fill(peer))
        return actions

    def on_log_advanced(self, max_phy_offset: int) -> list[MasterAction]:
        if max_phy_offset < self._max:
            raise ValueError(f"master log went back from {self._max} to {max_phy_offset}")
        self._max = max_phy_offset
        actions: list[MasterAction] = []
        for peer in self._peers.values():
            actions.extend(self._fill(peer))
        return actions

    def on_log_trimmed(self, min_phy_offset: int) -> list[MasterAction]:
        """Segments below ``min_phy_offset`` are gone; peers that still need them are told."""
        if not self._min <= min_phy_offset <= self._max:
            raise ValueError(f"min offset {min_phy_offset} outside [{self._min}, {self._max}]")
        self._min = min_phy_offset
        actions: list[MasterAction] = []
        for peer in [p for p in self._peers.values() if p.next_phy_offset < min_phy_offset]:
            reason = (f"slave needs {peer.next_phy_offset} but the master now starts at "
                      f"{min_phy_offset}")
            actions.append(_error(peer.peer_id, peer.session, ResponseCode.OFFSET_OUT_OF_RANGE,
                                  reason, min_phy_offset))
            actions.extend(self._forget(peer.peer_id, reason))
        return actions

    def tick(self, now_ms: int) -> list[MasterAction]:
        self._clock(now_ms)
        actions: list[MasterAction] = []
        for peer in list(self._peers.values()):
            silent_ms = self._now_ms - peer.last_heard_ms
            if silent_ms > self._cfg.haHousekeepingInterval:
                actions.extend(self._forget(peer.peer_id, f"silent for {silent_ms} ms"))
            elif self._now_ms >= self._beat_due_ms(peer):
                beat = Heartbeat(peer.session, self.epoch, self._max, peer.next_phy_offset,
                                 self._confirm)
                actions.append(Send(peer.peer_id, (encode_header(beat),)))
                peer.last_sent_ms = self._now_ms
                peer.told_confirm = self._confirm
            if peer.peer_id in self._peers and self._cfg.haFlowControlEnable:
                actions.extend(self._fill(peer))  # a new slice may allow more
        return actions

    def disconnect(self, peer_id: PeerId, reason: str) -> list[MasterAction]:
        """The transport lost the peer (e.g. EHOSTUNREACH under ROUTER_MANDATORY)."""
        return self._forget(peer_id, reason)

    # ---- internals ---------------------------------------------------------------------------
    def _beat_due_ms(self, peer: _Peer) -> int:
        """When ``peer`` gets its next HEARTBEAT: an idle interval after the last frame, or
        CONFIRM_NOTICE_MS after it when the confirmed offset moved past what it was told."""
        idle = self._cfg.haSendHeartbeatInterval
        if peer.told_confirm < self._confirm:
            idle = min(idle, CONFIRM_NOTICE_MS)
        return peer.last_sent_ms + idle

    def _clock(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)

    def _in_sync(self, peer: _Peer) -> bool:
        return (self._now_ms - peer.last_heard_ms <= self._cfg.haHousekeepingInterval
                and self._max - peer.ack_offset <= self._cfg.haMaxGapNotInSync)

    def _snapshot(self, p: _Peer) -> SlaveSnapshot:
        return SlaveSnapshot(p.peer_id, p.address, p.broker_id, p.session, p.ack_offset,
                             p.next_phy_offset, self._max - p.ack_offset, self._in_sync(p),
                             p.last_heard_ms, p.refused_acks)

    def _forget(self, peer_id: PeerId, reason: str) -> list[MasterAction]:
        return [Drop(peer_id, reason)] if self._peers.pop(peer_id, None) is not None else []

    def _refuse_hello(self, peer_id: PeerId, hello: Hello) -> list[MasterAction] | None:
        """Actions refusing or ignoring this HELLO, or None to go on with the handshake."""
        if self._is_stale_hello(peer_id, hello):
            return []
        problem = self._hello_problem(hello)
        if problem is not None:
            code, reason = problem
            return [_error(peer_id, hello.session, code, reason),
                    *self._forget(peer_id, reason)]
        if ep.last_epoch(hello.epochs) > self.epoch:
            reason = (f"slave {hello.slave_address} knows epoch {ep.last_epoch(hello.epochs)}, "
                      f"this master is at {self.epoch}")
            return [_error(peer_id, hello.session, ResponseCode.STALE_EPOCH, reason),
                    *self._forget(peer_id, reason),
                    Fenced(peer_id, ep.last_epoch(hello.epochs), reason)]
        return None

    def _is_stale_hello(self, peer_id: PeerId, hello: Hello) -> bool:
        """A duplicate or an older HELLO of a slave we already serve a newer handshake of."""
        for peer in self._peers.values():
            same = peer.peer_id == peer_id or peer.broker_id == hello.broker_id
            if same and peer.session >= hello.session:
                return True
        return False

    def _hello_problem(self, hello: Hello) -> tuple[ResponseCode, str] | None:
        if hello.version != PROTOCOL_VERSION:
            return (ResponseCode.VERSION_NOT_SUPPORTED,
                    f"HA protocol version {hello.version}, master speaks {PROTOCOL_VERSION}")
        if hello.broker_name != self._cfg.brokerName:
            return (ResponseCode.BAD_REQUEST,
                    f"slave of {hello.broker_name!r} at the master of {self._cfg.brokerName!r}")
        if hello.broker_id < 1:
            return ResponseCode.BAD_REQUEST, f"slave brokerId {hello.broker_id} must be > 0"
        known = any(p.broker_id == hello.broker_id for p in self._peers.values())
        if not known and len(self._peers) >= self._max_peers:
            return ResponseCode.SYSTEM_BUSY, f"already serving {self._max_peers} slaves"
        return None

    def _start_offset(self, hello: Hello) -> int | Error:
        """Where to stream from (the slave truncates there first), or the ERROR to answer."""
        slave_max = hello.max_phy_offset
        point = ep.find_divergence(hello.epochs, slave_max, self._history, self._max)
        if point < slave_max and self._slave_ahead(hello, point):
            return Error(hello.session, ResponseCode.OFFSET_OUT_OF_RANGE, self._max,
                         f"slave max {slave_max} is beyond master max {self._max} in the same "
                         f"epoch {self.epoch}: refusing to discard it (promote that slave or "
                         f"wipe it)")
        if point >= self._min:
            return point
        if slave_max == 0:
            return self._min  # an empty slave starts where the master's log starts
        return Error(hello.session, ResponseCode.OFFSET_OUT_OF_RANGE, self._min,
                     f"slave needs offset {point} (its max {slave_max}) but the master keeps "
                     f"only [{self._min}, {self._max}]: wipe the slave store to resync")

    def _slave_ahead(self, hello: Hello, point: int) -> bool:
        """The slave holds bytes past this master's max in this master's own last epoch: it
        has data the master lost, not a divergent tail."""
        if point != self._max:
            return False
        index = ep.entry_index_at(hello.epochs, self._max)
        return index >= 0 and hello.epochs[index] == self._history[-1]

    def _replace_same_broker(self, peer_id: PeerId, broker_id: int) -> list[MasterAction]:
        actions: list[MasterAction] = []
        for old in [p for p in self._peers.values() if p.broker_id == broker_id]:
            actions.extend(self._forget(old.peer_id, "replaced by a newer handshake"))
        self._peers.pop(peer_id, None)
        return actions

    def _fill(self, peer: _Peer) -> list[MasterAction]:
        """DATA ranges to send now: up to the master's max, within the window."""
        actions: list[MasterAction] = []
        while (length := self._next_length(peer)) > 0:
            history = self._history
            entry = history[-1]
            if entry.start_phy_offset > peer.next_phy_offset:  # an earlier term's bytes
                entry = history[ep.entry_index_at(history, peer.next_phy_offset)]
            actions.append(ReadAndSend(peer.peer_id, peer.session, entry.epoch,
                                       entry.start_phy_offset, peer.next_phy_offset, length,
                                       self._confirm))
            peer.told_confirm = self._confirm
            peer.next_phy_offset += length
            if self._cfg.haFlowControlEnable:
                peer.flow_tokens -= length
        if actions:
            peer.last_sent_ms = self._now_ms
        return actions

    def _next_length(self, peer: _Peer) -> int:
        phy_offset = peer.next_phy_offset
        if phy_offset >= self._max:
            return 0  # sent everything (how every fill ends)
        cfg = self._cfg
        segment = cfg.mappedFileSizeCommitLog
        history = self._history
        if history[-1].start_phy_offset <= phy_offset:
            end = self._max  # the current term's bytes (every put): no search
        else:
            end = ep.entry_end(history, ep.entry_index_at(history, phy_offset), self._max)
        return min(
            cfg.haTransferBatchSize,
            cfg.haWindowBytes - (phy_offset - peer.ack_offset),
            end - phy_offset,
            segment - phy_offset % segment,
            self._flow_allowance(peer) if cfg.haFlowControlEnable else cfg.haTransferBatchSize,
        )

    def _flow_allowance(self, peer: _Peer) -> int:
        """Bytes ``peer`` may be sent now (RocketMQ 5's FlowMonitor: at most
        ``maxHaTransferByteInSecond`` when ``haFlowControlEnable``). Nothing until the bucket
        holds a whole frame's worth, so the cap never cuts the stream into slivers."""
        batch = self._cfg.haTransferBatchSize
        if not self._cfg.haFlowControlEnable:
            return batch
        self._refill(peer)
        tokens = int(peer.flow_tokens)
        return tokens if tokens >= self._flow_need(peer) else 0

    def _refill(self, peer: _Peer) -> None:
        cap = FLOW_BURST_BATCHES * self._cfg.haTransferBatchSize
        if peer.flow_tokens < 0:
            peer.flow_tokens, peer.flow_at_ms = float(cap), self._now_ms
            return
        elapsed = self._now_ms - peer.flow_at_ms
        if elapsed > 0:
            earned = elapsed * self._cfg.maxHaTransferByteInSecond / 1000
            peer.flow_tokens = min(float(cap), peer.flow_tokens + earned)
            peer.flow_at_ms = self._now_ms

    def _flow_need(self, peer: _Peer) -> int:
        """The next frame's length as the window and the log allow it (0: nothing to send)."""
        wanted = min(self._max, peer.ack_offset + self._cfg.haWindowBytes)
        return max(0, min(self._cfg.haTransferBatchSize, wanted - peer.next_phy_offset))

    def _flow_shortfall(self, peer: _Peer) -> int:
        """Bytes the bucket lacks for the next frame the window would allow (0: not held back
        by flow control)."""
        if not self._cfg.haFlowControlEnable or peer.flow_tokens < 0:
            return 0
        need = self._flow_need(peer)
        return max(0, need - int(peer.flow_tokens)) if need else 0
