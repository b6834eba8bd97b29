"""The slave's side of replication as a deterministic state machine (no sockets, no threads).

The driver (``slave/ha_client.py``: a ZeroMQ DEALER to ``haMasterAddress``) feeds it decoded
master frames and the clock:

    start(now_ms)                        first HELLO
    on_frame(frame, now_ms)              HELLO_REPLY / DATA / HEARTBEAT / ERROR
    on_bad_frame(reason, now_ms)         a frame that failed to decode (HAProtocolError)
    resync(reason, now_ms)               the driver could not carry out an action (append failed)
    tick(now_ms)                         acks-as-heartbeats, silence detection, retries;
                                         see ``next_deadline_ms``

and carries out, in order, the actions returned:

    Reconnect(reason)                    close and reopen the DEALER socket (new identity)
    SendToMaster(frames)                 send these multipart frames
    Truncate(phy_offset)                 ``store.truncate_to(phy_offset)`` (divergent tail)
    ResetLog(phy_offset)                 the store is empty; its log starts at ``phy_offset``
    SaveEpochs(history)                  ``epochs.save(root, history)`` (always before Append)
    Append(phy_offset, data)             ``store.append_replicated(phy_offset, data)``
    Failed(code, phy_offset, reason)     the master refused us; log it (we retry later)

States: HANDSHAKE (HELLO sent, waiting for the reply of that session), TRANSFER (appending),
FAILED (the master answered ERROR; retry after a back-off). Every HELLO starts a new session;
frames of any other session are ignored, so a late reply can never truncate the log.

Rules: the slave's max offset is the only offset it expects. A DATA frame elsewhere (gap or
overlap) is never appended: the slave re-HELLOs from its own max; a frame entirely below the max
(a duplicate) is ignored. A DATA epoch older than the slave's last recorded epoch, unknown to
the master's history, or new but not starting at the frame's offset is refused the same way.
The first frame of a newer epoch records ``(epoch, epoch_start_phy_offset)`` before the bytes
are appended. Records may be cut anywhere between frames (RocketMQ #9002): the slave appends a
byte stream and never parses it here. After each append it acks its new max (the ack doubles as
heartbeat, also sent every ``haSendHeartbeatInterval``). A master silent for
``haHousekeepingInterval`` means reconnect and re-HELLO; a HEARTBEAT saying more was sent than
the slave holds means frames were lost: re-HELLO.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TypeAlias

from common.core.config import BrokerConfig
from common.core.errors import ResponseCode
from common.ha import epochs as ep
from common.ha.epochs import EpochHistory
from common.ha.protocol import (
    NO_OFFSET,
    Data,
    Error,
    Frame,
    Heartbeat,
    Hello,
    HelloReply,
    encode_ack,
    encode_header,
)


# ---- actions ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class SendToMaster:
    frames: tuple[bytes | memoryview, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Append:
    phy_offset: int
    data: bytes | memoryview


@dataclasses.dataclass(frozen=True, slots=True)
class Truncate:
    phy_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class ResetLog:
    phy_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class SaveEpochs:
    history: EpochHistory


@dataclasses.dataclass(frozen=True, slots=True)
class Reconnect:
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    code: ResponseCode
    phy_offset: int
    reason: str


SlaveAction: TypeAlias = SendToMaster | Append | Truncate | ResetLog | SaveEpochs | Reconnect | Failed


class SlaveState(enum.Enum):
    HANDSHAKE = "HANDSHAKE"
    TRANSFER = "TRANSFER"
    FAILED = "FAILED"


# Errors after which retrying soon cannot help: back off for haHousekeepingInterval.
_HARD_ERRORS = frozenset({ResponseCode.OFFSET_OUT_OF_RANGE, ResponseCode.STALE_EPOCH,
                          ResponseCode.VERSION_NOT_SUPPORTED})


@dataclasses.dataclass(frozen=True, slots=True)
class SlaveStats:
    state: SlaveState
    session: int
    max_phy_offset: int
    master_epoch: int
    master_max_phy_offset: int
    resyncs: int
    ignored_frames: int
    master_address: str = ""  # the master's client address, from its HELLO_REPLY


class SlaveCore:
    """Replication state of one slave towards its master."""

    def __init__(self, cfg: BrokerConfig, max_phy_offset: int, history: EpochHistory,
                 first_session: int, now_ms: int):
        ep.validate(history)
        self._cfg = cfg
        self._max = max_phy_offset
        self._history = ep.truncate_beyond(history, max_phy_offset)
        self._history_trimmed = self._history != history
        self._session = first_session
        self._state = SlaveState.HANDSHAKE
        self._master_epoch = 0
        self._master_history: EpochHistory = ()
        self._master_max = NO_OFFSET
        self._last_heard_ms = now_ms
        self._last_sent_ms = now_ms
        self._retry_at_ms = now_ms
        self._resyncs = 0
        self._ignored_frames = 0
        self._master_address = ""  # kept across reconnects: the last master that answered
        self._min_master_epoch = 0  # the controller's newest epoch: an older master is refused
        # the master's confirmed offset as its last frame of this session said (None: not told
        # in this session yet; NO_OFFSET: it holds nothing back)
        self._master_confirm: int | None = None

    # ---- read-only state ---------------------------------------------------------------------
    @property
    def state(self) -> SlaveState:
        return self._state

    @property
    def session(self) -> int:
        return self._session

    @property
    def max_phy_offset(self) -> int:
        return self._max

    @property
    def history(self) -> EpochHistory:
        return self._history

    @property
    def known_epoch(self) -> int:
        """The newest epoch this slave knows of (its log's, its master's, the controller's);
        every ACK carries it, so a master of an older term learns it was replaced."""
        return max(ep.last_epoch(self._history), self._master_epoch, self._min_master_epoch)

    @property
    def master_confirm(self) -> int | None:
        """What the master of this session last said every SyncStateSet member holds (None:
        nothing said yet in this session; NO_OFFSET: the master holds nothing back). The
        driver serves consumers nothing past it (``MessageStore.set_confirm_offset``)."""
        return self._master_confirm

    def require_epoch(self, epoch: int) -> None:
        """Refuse any master older than ``epoch`` from now on (the controller named a master
        of that epoch): its HELLO_REPLY fails the handshake, its DATA starts a new one."""
        self._min_master_epoch = max(self._min_master_epoch, epoch)

    def stats(self) -> SlaveStats:
        return SlaveStats(self._state, self._session, self._max, self._master_epoch,
                          self._master_max, self._resyncs, self._ignored_frames,
                          self._master_address)

    def next_deadline_ms(self) -> int:
        """When ``tick`` next has something to do."""
        if self._state is SlaveState.FAILED:
            return self._retry_at_ms
        silence = self._last_heard_ms + self._cfg.haHousekeepingInterval
        return min(silence, self._last_sent_ms + self._cfg.haSendHeartbeatInterval)

    # ---- inputs ------------------------------------------------------------------------------
    def start(self, now_ms: int) -> list[SlaveAction]:
        actions: list[SlaveAction] = []
        if self._history_trimmed:
            actions.append(SaveEpochs(self._history))
        self._last_heard_ms = now_ms
        actions.append(self._hello(now_ms))
        return actions

    def on_frame(self, frame: Frame, now_ms: int) -> list[SlaveAction]:
        if isinstance(frame, HelloReply):
            return self.on_hello_reply(frame, now_ms)
        if isinstance(frame, Data):
            return self.on_data(frame, now_ms)
        if isinstance(frame, Heartbeat):
            return self.on_heartbeat(frame, now_ms)
        if isinstance(frame, Error):
            return self.on_error(frame, now_ms)
        return self.on_bad_frame(f"a master may not send {type(frame).__name__}", now_ms)

    def on_bad_frame(self, reason: str, now_ms: int) -> list[SlaveAction]:
        return self._resync(f"malformed frame from master: {reason}", now_ms, reconnect=True)

    def resync(self, reason: str, now_ms: int) -> list[SlaveAction]:
        return self._resync(reason, now_ms, reconnect=False)

    def on_hello_reply(self, reply: HelloReply, now_ms: int) -> list[SlaveAction]:
        if not self._current(reply.session, SlaveState.HANDSHAKE):
            return []
        self._last_heard_ms = now_ms
        if reply.epoch < ep.last_epoch(self._history):
            return self._fail(ResponseCode.STALE_EPOCH, reply.epoch,
                              f"master epoch {reply.epoch} is older than ours "
                              f"{ep.last_epoch(self._history)}", now_ms)
        if reply.epoch < self._min_master_epoch:
            return self._fail(ResponseCode.STALE_EPOCH, reply.epoch,
                              f"master epoch {reply.epoch} is older than the controller's "
                              f"{self._min_master_epoch}: a replaced master", now_ms)
        actions = self._move_to(reply, now_ms)
        if self._state is SlaveState.FAILED:
            return actions
        actions.extend(self._adopt_master_epochs(reply.epochs, reply.max_phy_offset))
        self._state = SlaveState.TRANSFER
        self._master_confirm = None  # a new master may confirm less than the last one
        self._master_epoch = reply.epoch
        self._master_history = reply.epochs
        self._master_max = reply.max_phy_offset
        if reply.master_address:
            self._master_address = reply.master_address
        actions.append(self._ack(now_ms))
        return actions

    def on_data(self, data: Data, now_ms: int) -> list[SlaveAction]:
        if not self._current(data.session, SlaveState.TRANSFER):
            return []
        if self._master_epoch < self._min_master_epoch:
            # the master of this session was replaced since the handshake (its DATA of older
            # epochs is fine from a current master: that is the log's history)
            return self._fail(ResponseCode.STALE_EPOCH, self._master_epoch,
                              f"master of epoch {self._master_epoch} was replaced by the "
                              f"controller (epoch {self._min_master_epoch})", now_ms)
        self._last_heard_ms = now_ms
        self._master_confirm = data.confirm_offset
        if data.end_phy_offset <= self._max:
            self._ignored_frames += 1  # a duplicate of bytes we hold
            return []
        if data.phy_offset != self._max:
            return self._resync(f"DATA at {data.phy_offset}, expected our max {self._max}",
                                now_ms, reconnect=False)
        problem = self._epoch_problem(data)
        if problem is not None:
            return self._resync(problem, now_ms, reconnect=False)
        actions: list[SlaveAction] = []
        if data.epoch > ep.last_epoch(self._history):
            self._history = ep.append_epoch(self._history, data.epoch,
                                            data.epoch_start_phy_offset)
            self._master_epoch = max(self._master_epoch, data.epoch)
            actions.append(SaveEpochs(self._history))
        actions.append(Append(data.phy_offset, data.data))
        self._max = data.end_phy_offset
        actions.append(self._ack(now_ms))
        return actions

    def on_heartbeat(self, beat: Heartbeat, now_ms: int) -> list[SlaveAction]:
        if not self._current(beat.session, SlaveState.TRANSFER):
            return []
        self._last_heard_ms = now_ms
        self._master_max = beat.max_phy_offset
        self._master_confirm = beat.confirm_offset
        if beat.sent_phy_offset > self._max:
            return self._resync(f"master sent up to {beat.sent_phy_offset} but we hold "
                                f"{self._max}: frames were lost", now_ms, reconnect=False)
        return []

    def on_error(self, error: Error, now_ms: int) -> list[SlaveAction]:
        if error.session != self._session or self._state is SlaveState.FAILED:
            self._ignored_frames += 1
            return []
        self._last_heard_ms = now_ms
        if self._state is SlaveState.TRANSFER and error.code not in _HARD_ERRORS:
            return self._resync(f"master: {error.code.name}: {error.reason}", now_ms,
                                reconnect=False)
        return self._fail(error.code, error.phy_offset, error.reason, now_ms)

    def tick(self, now_ms: int) -> list[SlaveAction]:
        if self._state is SlaveState.FAILED:
            if now_ms >= self._retry_at_ms:
                return self._resync("retrying after the master's error", now_ms, reconnect=True)
            return []
        silent_ms = now_ms - self._last_heard_ms
        if silent_ms >= self._cfg.haHousekeepingInterval:
            return self._resync(f"master silent for {silent_ms} ms", now_ms, reconnect=True)
        if now_ms - self._last_sent_ms < self._cfg.haSendHeartbeatInterval:
            return []
        if self._state is SlaveState.HANDSHAKE:
            return self._resync("no HELLO_REPLY yet", now_ms, reconnect=False)
        return [self._ack(now_ms)]

    # ---- internals ---------------------------------------------------------------------------
    def _current(self, session: int, state: SlaveState) -> bool:
        if session == self._session and self._state is state:
            return True
        self._ignored_frames += 1
        return False

    def _hello(self, now_ms: int) -> SendToMaster:
        hello = Hello(self._session, self._cfg.brokerName, self._cfg.brokerId, self._max,
                      self._cfg.client_address, self._history)
        self._last_sent_ms = now_ms
        return SendToMaster((encode_header(hello),))

    def _ack(self, now_ms: int) -> SendToMaster:
        self._last_sent_ms = now_ms
        return SendToMaster((encode_ack(self._session, self._max, self.known_epoch),))

    def _resync(self, reason: str, now_ms: int, reconnect: bool) -> list[SlaveAction]:
        """Start a new handshake from our own max offset."""
        self._resyncs += 1
        self._session += 1
        self._state = SlaveState.HANDSHAKE
        actions: list[SlaveAction] = []
        if reconnect:
            self._last_heard_ms = now_ms
            actions.append(Reconnect(reason))
        actions.append(self._hello(now_ms))
        return actions

    def _fail(self, code: ResponseCode, phy_offset: int, reason: str,
              now_ms: int) -> list[SlaveAction]:
        self._state = SlaveState.FAILED
        backoff = (self._cfg.haHousekeepingInterval if code in _HARD_ERRORS
                   else self._cfg.haSendHeartbeatInterval)
        self._retry_at_ms = now_ms + backoff
        return [Failed(code, phy_offset, reason)]

    def _move_to(self, reply: HelloReply, now_ms: int) -> list[SlaveAction]:
        """Truncate (divergent tail) or reset (empty log) so that our max is the start."""
        start = reply.start_phy_offset
        if start < self._max:
            self._max = start
            self._history = ep.truncate_from(self._history, start)
            return [Truncate(start), SaveEpochs(self._history)]
        if start == self._max:
            return []
        if self._max != 0:
            return self._fail(ResponseCode.BAD_REQUEST, start,
                              f"master would start at {start}, past our max {self._max}",
                              now_ms)
        # An empty log restarting at the master's min offset: the master's epochs up to there
        # become ours, so that a later HELLO (max = start, no bytes) proves the same prefix.
        self._max = start
        self._history = ep.truncate_beyond(reply.epochs, start)
        return [ResetLog(start), SaveEpochs(self._history)]

    def _adopt_master_epochs(self, master_history: EpochHistory,
                             master_max: int) -> list[SlaveAction]:
        """After the handshake our log is the master's up to our max: take the master's epoch
        entries up to there (including a term that starts exactly at our max and has not sent
        us a byte yet). Without this a slave promoted before the first DATA frame of the
        master's term numbers its own term like that one, at the same start offset, and the
        two terms' bytes look identical to ``find_divergence`` (the other broker keeps its
        divergent tail). Saving it also raises the learned-epoch marker (term.py)."""
        adopted = ep.truncate_beyond(master_history, self._max)
        if adopted == self._history or not adopted:
            return []
        try:
            ep.validate(adopted)
        except ValueError:
            return []
        if self._history and ep.find_divergence(self._history, self._max, master_history,
                                                max(master_max, self._max)) < self._max:
            return []  # the histories do not prove our whole log is the master's: keep ours
        self._history = adopted
        return [SaveEpochs(adopted)]

    def _epoch_problem(self, data: Data) -> str | None:
        """Why this DATA frame's epoch cannot extend our log, or None."""
        last = self._history[-1] if self._history else None
        if last is not None and data.epoch < last.epoch:
            return f"DATA epoch {data.epoch} is older than our epoch {last.epoch}"
        if last is not None and data.epoch == last.epoch:
            if data.epoch_start_phy_offset != last.start_phy_offset:
                return f"DATA says epoch {data.epoch} starts at {data.epoch_start_phy_offset}"
            return None
        if data.epoch <= self._master_epoch:
            entry = (data.epoch, data.epoch_start_phy_offset)
            if entry not in self._master_history:
                return f"DATA epoch {entry} is not in the master's history"
        if last is not None and data.epoch_start_phy_offset != data.phy_offset:
            return (f"new epoch {data.epoch} starts at {data.epoch_start_phy_offset}, "
                    f"not at this frame's offset {data.phy_offset}")
        return None
