"""A seeded in-process replication cluster: one MasterCore, 1..3 SlaveCores and a
GroupTransferCore over a fake network and clock (TigerBeetle VOPR style).

Everything random comes from one ``random.Random(seed)``, so a failing seed replays exactly
(``REPLOG_SIM_SEED=<seed>``). The master's log is a bytearray that grows as simulated puts
happen; each slave's log is a bytearray (plus a base offset after ``ResetLog``) changed only by
the slave core's actions, with an exact-offset check on every append.

The network carries encoded frames (so the codec is exercised too) over per-connection FIFO links
with random delay; during the fault phase it also drops, duplicates, reorders and partitions.
Then the network heals (FIFO, no loss) and every slave must converge to the master's log.
Invariant violations raise ``SimFailure`` naming the seed.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Hashable, Sequence

from common.core.config import BrokerConfig
from common.ha import epochs as ep
from common.ha import master_core as mc
from common.ha import slave_core as sc
from common.ha.epochs import EpochHistory
from common.ha.group_transfer_core import Admission, GroupTransferCore
from common.ha.protocol import Limits, decode

MASTER = b"master"
HEARTBEAT_MS = 100
HOUSEKEEPING_MS = 600
SLAVE_TIMEOUT_MS = 250
FAULT_PHASE_MS = 1000
HEAL_LIMIT_MS = 5000
HEALED_DELAY_MAX_MS = 3
MAX_EVENTS = 200_000


class SimFailure(AssertionError):
    pass


@dataclasses.dataclass
class Faults:
    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    delay_max_ms: int = 0
    partitions: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    active: bool = True


@dataclasses.dataclass
class Stats:
    puts: int = 0
    send_ok: int = 0
    slave_timeouts: int = 0
    slave_not_available: int = 0
    truncations: int = 0
    resets: int = 0
    resyncs: int = 0
    master_drops: int = 0
    appended_bytes: int = 0
    messages: int = 0

    def add(self, other: Stats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclasses.dataclass(order=True)
class _Message:
    deliver_at: int
    seq: int
    src: bytes = dataclasses.field(compare=False)
    dst: bytes = dataclasses.field(compare=False)
    frames: tuple[bytes, ...] = dataclasses.field(compare=False)


class Network:
    """Per-link FIFO with delay; faults may drop, duplicate, reorder or blackhole."""

    def __init__(self, rng: random.Random, faults: Faults):
        self.rng = rng
        self.faults = faults
        self.queue: list[_Message] = []
        self.link_tail: dict[tuple[bytes, bytes], int] = {}
        self.seq = 0
        self.sent = 0

    def blocked(self, slave_name: str, now_ms: int) -> bool:
        window = self.faults.partitions.get(slave_name)
        return self.faults.active and window is not None and window[0] <= now_ms < window[1]

    def send(self, src: bytes, dst: bytes, frames: Sequence[bytes | memoryview], now_ms: int,
             slave_name: str) -> None:
        self.sent += 1
        f = self.faults
        if self.blocked(slave_name, now_ms) or (f.active and self.rng.random() < f.drop):
            return
        copies = 2 if f.active and self.rng.random() < f.dup else 1
        payload = tuple(bytes(x) for x in frames)
        for _ in range(copies):
            self._enqueue(src, dst, payload, now_ms)

    def _enqueue(self, src: bytes, dst: bytes, payload: tuple[bytes, ...], now_ms: int) -> None:
        at = now_ms + (self.rng.randint(0, self.faults.delay_max_ms)
                       if self.faults.delay_max_ms else 0)
        reorder = self.faults.active and self.rng.random() < self.faults.reorder
        if not reorder:  # FIFO per connection, as ZeroMQ over one TCP connection
            at = max(at, self.link_tail.get((src, dst), 0))
            self.link_tail[(src, dst)] = at
        self.seq += 1
        heapq.heappush(self.queue, _Message(at, self.seq, src, dst, payload))

    def next_time(self) -> int | None:
        return self.queue[0].deliver_at if self.queue else None

    def pop_due(self, now_ms: int) -> _Message | None:
        if self.queue and self.queue[0].deliver_at <= now_ms:
            return heapq.heappop(self.queue)
        return None


class SimSlave:
    def __init__(self, name: str, base: int, log: bytearray, history: EpochHistory,
                 core: sc.SlaveCore):
        self.name = name
        self.base = base
        self.log = log
        self.history = history
        self.core = core
        self.generation = 0
        self.verified = False  # log checked against the master's since the last handshake
        self.truncated_at: list[int] = []
        self.expected_truncation: int | None = None  # a divergent tail must be cut here

    @property
    def peer_id(self) -> bytes:
        return f"{self.name}#{self.generation}".encode()

    @property
    def max_phy_offset(self) -> int:
        return self.base + len(self.log)


class Cluster:
    """One simulation run; ``run()`` raises SimFailure on any broken invariant."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.stats = Stats()
        self._choose_config()
        self._build_master()
        self.slaves = [self._build_slave(i) for i in range(self.n_slaves)]
        self.by_name = {s.name: s for s in self.slaves}
        self.net = Network(self.rng, self._choose_faults())
        self.limits = Limits.from_config(self.cfg)
        self.gt = GroupTransferCore(SLAVE_TIMEOUT_MS, max_waiters=64)
        self.waiting: dict[Hashable, tuple[int, int]] = {}  # token -> (end offset, admit time)
        self.next_put_ms = 0
        self.put_seq = 0

    # ---- set-up ------------------------------------------------------------------------------
    def _choose_config(self) -> None:
        r = self.rng
        batch = r.choice([100, 500, 2000])
        self.n_slaves = r.randint(1, 3)
        self.needed = r.randint(0, self.n_slaves)
        self.cfg = BrokerConfig(
            brokerName="sim", haTransferBatchSize=batch,
            haWindowBytes=r.choice([2 * batch, 3 * batch + 7, 8 * batch]),
            mappedFileSizeCommitLog=r.choice([1024, 4096]),
            haSendHeartbeatInterval=HEARTBEAT_MS, haHousekeepingInterval=HOUSEKEEPING_MS,
            haMaxGapNotInSync=r.choice([500, 1 << 20]), slaveTimeout=SLAVE_TIMEOUT_MS,
            inSyncReplicas=self.needed + 1,
            haFlowControlEnable=r.random() < 0.3,
            maxHaTransferByteInSecond=r.choice([100 * batch, 400 * batch]),
        )

    def _build_master(self) -> None:
        r = self.rng
        size = r.randint(0, 4000)
        self.master_log = bytearray(r.randbytes(size))
        history: EpochHistory = (ep.EpochEntry(1, 0),)
        for start in sorted(r.randint(0, size) for _ in range(r.randint(0, 3))):
            history = ep.append_epoch(history, ep.last_epoch(history) + r.randint(1, 2), start)
        segment = self.cfg.mappedFileSizeCommitLog
        trimmed = r.random() < 0.2  # old segments deleted: the log starts at a segment start
        self.min_phy_offset = (size // segment) * segment if trimmed else 0
        self.master_history = history
        self.master = mc.MasterCore(self.cfg, history, self.min_phy_offset, size, now_ms=0)

    def _build_slave(self, index: int) -> SimSlave:
        r = self.rng
        name = f"s{index + 1}"
        size = len(self.master_log)
        kind = r.choice(["empty", "prefix", "divergent"])
        boundaries = [e.start_phy_offset for e in self.master_history[1:]
                      if e.start_phy_offset >= self.min_phy_offset]
        expected_cut = None
        if kind == "divergent" and boundaries:
            cut = expected_cut = r.choice(boundaries)
            log = self.master_log[:cut] + bytearray(r.randbytes(r.randint(1, 2000)))
            history = ep.truncate_from(self.master_history, cut)
        elif kind == "prefix" and size > self.min_phy_offset:
            cut = r.randint(max(1, self.min_phy_offset), size)
            log, history = self.master_log[:cut], ep.truncate_from(self.master_history, cut)
        else:
            log, history = bytearray(), ()
        cfg = dataclasses.replace(self.cfg, brokerId=index + 1, listenPort=20000 + index)
        core = sc.SlaveCore(cfg, len(log), history, first_session=1000 * (index + 1), now_ms=0)
        slave = SimSlave(name, 0, log, history, core)
        slave.expected_truncation = expected_cut
        return slave

    def _choose_faults(self) -> Faults:
        r = self.rng
        faults = Faults(
            drop=r.choice([0.0, 0.0, 0.01, 0.05, 0.2]),
            dup=r.choice([0.0, 0.02, 0.1]),
            reorder=r.choice([0.0, 0.0, 0.05, 0.2]),
            delay_max_ms=r.choice([0, 5, 30, 80]),
        )
        for slave in self.slaves:
            if r.random() < 0.5:
                begin = r.randint(0, FAULT_PHASE_MS)
                faults.partitions[slave.name] = (begin, begin + r.randint(50, 1200))
        return faults

    def fail(self, what: str) -> SimFailure:
        return SimFailure(f"seed {self.seed} at t={self.now_ms} ms: {what} "
                          f"(replay: REPLOG_SIM_SEED={self.seed})")

    # ---- the run -----------------------------------------------------------------------------
    def _heal_limit_ms(self) -> int:
        """HEAL_LIMIT_MS, plus under flow control the time the capped rate needs to resend
        the whole log (a slave may have to start over)."""
        if not self.cfg.haFlowControlEnable:
            return HEAL_LIMIT_MS
        return HEAL_LIMIT_MS + len(self.master_log) * 1000 // self.cfg.maxHaTransferByteInSecond

    def run(self) -> Stats:
        for slave in self.slaves:
            self._slave_actions(slave, slave.core.start(self.now_ms))
        self._loop(until_ms=FAULT_PHASE_MS, puts=True)
        self.net.faults.active = False  # heal: FIFO links, no loss, short delays
        self.net.faults.delay_max_ms = min(self.net.faults.delay_max_ms, HEALED_DELAY_MAX_MS)
        self._loop(until_ms=FAULT_PHASE_MS + self._heal_limit_ms(), puts=False)
        self._check_converged()
        self.stats.messages = self.net.sent
        return self.stats

    def _loop(self, until_ms: int, puts: bool) -> None:
        for _ in range(MAX_EVENTS):
            if not puts and self._converged():
                return
            when = self._next_event_ms(puts)
            if when is None or when > until_ms:
                self.now_ms = until_ms
                return
            self.now_ms = max(self.now_ms, when)
            self._step(puts)
        raise self.fail(f"more than {MAX_EVENTS} events: livelock")

    def _next_event_ms(self, puts: bool) -> int | None:
        times = [self.net.next_time(), self.master.next_deadline_ms(),
                 self.gt.next_deadline_ms(), self.next_put_ms if puts else None]
        times += [s.core.next_deadline_ms() for s in self.slaves]
        for begin, end in self.net.faults.partitions.values():
            times += [t for t in (begin, end) if t > self.now_ms]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def _step(self, puts: bool) -> None:
        while (message := self.net.pop_due(self.now_ms)) is not None:
            self._deliver(message)
        if puts and self.now_ms >= self.next_put_ms:
            self._put()
        self._master_actions(self.master.tick(self.now_ms))
        for slave in self.slaves:
            self._slave_actions(slave, slave.core.tick(self.now_ms))
        for token in self.gt.tick(self.now_ms):
            self._timed_out(token)

    def _deliver(self, message: _Message) -> None:
        if message.dst == MASTER:
            name = message.src.decode().split("#")[0]
            if self.net.blocked(name, self.now_ms):
                return
            frame = decode(message.frames, self.limits)
            self._master_actions(self.master.on_frame(message.src, frame, self.now_ms))
            return
        name, _, generation = message.dst.decode().partition("#")
        slave = self.by_name[name]
        if int(generation) != slave.generation or self.net.blocked(name, self.now_ms):
            return  # that connection is closed, or the link is cut
        frame = decode(message.frames, self.limits)
        self._slave_actions(slave, slave.core.on_frame(frame, self.now_ms))

    def _put(self) -> None:
        r = self.rng
        self.next_put_ms = self.now_ms + r.randint(1, 60)
        self.master_log += r.randbytes(r.randint(1, 300))
        end = len(self.master_log)
        self.stats.puts += 1
        self._master_actions(self.master.on_log_advanced(end))
        self.put_seq += 1
        token = self.put_seq
        verdict = self.gt.admit(token, end, self.now_ms, self.master.in_sync_count(),
                                self.needed)
        if verdict is Admission.WAIT:
            self.waiting[token] = (end, self.now_ms)
        elif verdict is Admission.SEND_OK:
            self._check_replicated(end, "admitted as SEND_OK")
            self.stats.send_ok += 1
        elif verdict is Admission.SLAVE_NOT_AVAILABLE:
            if self.master.in_sync_count() >= self.needed:
                raise self.fail("SLAVE_NOT_AVAILABLE with enough in-sync slaves")
            self.stats.slave_not_available += 1
        else:
            raise self.fail(f"unexpected admission {verdict}")

    # ---- master driver -----------------------------------------------------------------------
    def _master_actions(self, actions: list[mc.MasterAction]) -> None:
        for action in actions:
            if isinstance(action, mc.ReadAndSend):
                self._read_and_send(action)
            elif isinstance(action, mc.Send):
                self._master_send(action.peer_id, action.frames)
            elif isinstance(action, mc.AcksAdvanced):
                self._acks_advanced(action)
            elif isinstance(action, mc.Drop):
                self.stats.master_drops += 1
            else:
                raise self.fail(f"unexpected master action {action}")

    def _master_send(self, peer_id: bytes, frames: Sequence[bytes | memoryview]) -> None:
        name, _, generation = peer_id.decode().partition("#")
        slave = self.by_name[name]
        if int(generation) != slave.generation:  # ROUTER_MANDATORY: EHOSTUNREACH
            self._master_actions(self.master.disconnect(peer_id, "peer gone"))
            return
        self.net.send(MASTER, peer_id, frames, self.now_ms, name)

    def _read_and_send(self, a: mc.ReadAndSend) -> None:
        end = a.phy_offset + a.length
        segment = self.cfg.mappedFileSizeCommitLog
        if a.phy_offset < self.master.min_phy_offset or end > len(self.master_log):
            raise self.fail(f"read outside the master's log: {a}")
        if a.phy_offset // segment != (end - 1) // segment:
            raise self.fail(f"DATA crosses a segment boundary: {a}")
        index = ep.entry_index_at(self.master_history, a.phy_offset)
        if self.master_history[index] != (a.epoch, a.epoch_start_phy_offset) or \
                ep.entry_end(self.master_history, index, end) < end:
            raise self.fail(f"DATA epoch wrong or crossing an epoch boundary: {a}")
        data = bytes(self.master_log[a.phy_offset:end])
        self._master_send(a.peer_id, a.frames(data))

    def _acks_advanced(self, a: mc.AcksAdvanced) -> None:
        if a.ack_offset > len(self.master_log):
            raise self.fail(f"ack {a.ack_offset} beyond master max {len(self.master_log)}")
        slave = self.by_name[a.peer_id.decode().split("#")[0]]
        if a.ack_offset > slave.max_phy_offset:
            raise self.fail(f"{slave.name} acked {a.ack_offset} but holds "
                            f"{slave.max_phy_offset}")
        for token in self.gt.on_acks(self.master.acked_offset_quorum(self.needed)):
            end, _ = self.waiting.pop(token)
            self._check_replicated(end, f"put {token} SEND_OK")
            self.stats.send_ok += 1

    def _check_replicated(self, end: int, what: str) -> None:
        holders = sum(1 for s in self.slaves if s.max_phy_offset >= end and s.verified)
        if holders < self.needed:
            raise self.fail(f"{what}: only {holders} slaves hold offset {end}, "
                            f"{self.needed} needed")

    def _timed_out(self, token: Hashable) -> None:
        end, admitted_ms = self.waiting.pop(token)
        waited = self.now_ms - admitted_ms
        if self.gt.acked_offset >= end:
            raise self.fail(f"put {token} timed out although acks cover {end}")
        if not SLAVE_TIMEOUT_MS <= waited <= SLAVE_TIMEOUT_MS + 1:
            raise self.fail(f"put {token} FLUSH_SLAVE_TIMEOUT after {waited} ms, "
                            f"timeout {SLAVE_TIMEOUT_MS}")
        self.stats.slave_timeouts += 1

    # ---- slave driver ------------------------------------------------------------------------
    def _slave_actions(self, slave: SimSlave, actions: list[sc.SlaveAction]) -> None:
        for action in actions:
            if isinstance(action, sc.SendToMaster):
                self.net.send(slave.peer_id, MASTER, action.frames, self.now_ms, slave.name)
            elif isinstance(action, sc.Append):
                self._append(slave, action)
            elif isinstance(action, sc.Truncate):
                self._truncate(slave, action.phy_offset)
            elif isinstance(action, sc.ResetLog):
                self._reset(slave, action.phy_offset)
            elif isinstance(action, sc.SaveEpochs):
                ep.validate(action.history)
                slave.history = action.history
            elif isinstance(action, sc.Reconnect):
                slave.generation += 1
            else:
                raise self.fail(f"{slave.name}: unexpected slave action {action}")
        if slave.core.state is sc.SlaveState.TRANSFER and not slave.verified:
            self._verify_prefix(slave)

    def _append(self, slave: SimSlave, a: sc.Append) -> None:
        if a.phy_offset != slave.max_phy_offset:
            raise self.fail(f"{slave.name} appends at {a.phy_offset}, its log ends at "
                            f"{slave.max_phy_offset}")
        end = a.phy_offset + len(a.data)
        if bytes(a.data) != self.master_log[a.phy_offset:end]:
            raise self.fail(f"{slave.name} appended bytes that differ from the master's at "
                            f"{a.phy_offset}")
        slave.log += a.data
        self.stats.appended_bytes += len(a.data)

    def _truncate(self, slave: SimSlave, phy_offset: int) -> None:
        if not slave.base <= phy_offset <= slave.max_phy_offset:
            raise self.fail(f"{slave.name} truncates at {phy_offset} outside its log")
        del slave.log[phy_offset - slave.base:]
        slave.truncated_at.append(phy_offset)
        slave.verified = False
        self.stats.truncations += 1

    def _reset(self, slave: SimSlave, phy_offset: int) -> None:
        if slave.max_phy_offset != 0:
            raise self.fail(f"{slave.name} reset a non-empty log")
        slave.base, slave.log = phy_offset, bytearray()
        self.stats.resets += 1

    def _verify_prefix(self, slave: SimSlave) -> None:
        if slave.log != self.master_log[slave.base:slave.max_phy_offset]:
            raise self.fail(f"{slave.name}'s log is not a prefix of the master's")
        slave.verified = True

    # ---- the end -----------------------------------------------------------------------------
    def _converged(self) -> bool:
        size = len(self.master_log)
        return not self.waiting and all(s.max_phy_offset == size for s in self.slaves)

    def _check_converged(self) -> None:
        size = len(self.master_log)
        if self.waiting:
            raise self.fail(f"{len(self.waiting)} SYNC puts never completed")
        for s in self.slaves:
            if s.max_phy_offset != size:
                raise self.fail(f"{s.name} did not converge: {s.max_phy_offset} of {size} "
                                f"({s.core.stats()})")
            self._verify_prefix(s)
            if not set(s.history) <= set(self.master_history):
                raise self.fail(f"{s.name} history {s.history} not in {self.master_history}")
            if s.history != s.core.history:
                raise self.fail(f"{s.name}: saved history differs from the core's")
            self.stats.resyncs += s.core.stats().resyncs
        self._check_divergent_truncation()

    def _check_divergent_truncation(self) -> None:
        for s in self.slaves:
            want = [] if s.expected_truncation is None else [s.expected_truncation]
            if s.truncated_at != want:
                raise self.fail(f"{s.name} truncated at {s.truncated_at}, expected {want} "
                                f"(epochs {self.master_history})")


def run_seed(seed: int) -> Stats:
    return Cluster(seed).run()
